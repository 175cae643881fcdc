"""The tokenizer: GPT-1's text cleanup (ftfy + ``text_standardize``), spaCy's word split and BPE, offline
(``tokenizer.py``, ``text_clean.py``, ``word_split.py``, ``fix_encoding_rules.py``) and in core TensorFlow ops
for served SavedModels (``tf_tokenizer.py``, ``tf_text_clean.py``, ``tf_word_split.py``, ``tf_fix_encoding.py``,
``tf_strings.py``). Import the modules themselves (``from gpt_tf.text.tokenizer import GPTTokenizer``)."""
