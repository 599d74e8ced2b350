"""Text above the engine: the tokenizer, streaming detokenization, chat templates and their bounds, and tool
calls' formats."""
