"""The data the model trains on, as libraries (``pipelines/`` holds the command lines that write it):

  records       the TFRecord files, their manifest and its checks.
  reader        tf.data reader of the pre-training windows, yielding (inputs, targets) batches.
  task_readers  the labeled tasks' files (GLUE TSVs, Story Cloze, RACE, ...) read into rows, bad rows counted.
  task_rows     the row types and the registry's fields they fill.
  task_splits   deterministic hash splits (dev hold-outs, samples).
  winograd      the Winograd schema files §5's zero-shot heuristics read.
  transforms    §3.3's input transformations (start, delimiter and extract tokens; pairs, both orders, choices)
                and the fine-tuning dataset of a task's records.
  task_batches  length buckets and the epoch's plan of batches.
  common        what the writers share: atomic files, stale temporaries, live pids.
"""
