"""Text above the engine: streaming detokenization, chat templates and their bounds, and pipeline()."""
