"""Any text as a task: readers (JSONL, chat messages, plain text, ArrayRecord), chat templates, canvases and
the grain pipeline; `task.TextTask` is the registry's "text". docs/text.md."""
