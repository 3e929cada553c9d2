"""Generic data helpers: the tokenizer loader (``tokenizer``). Task data lives with its task (dgemma/tasks).

Submodules are not imported here so that ``import dgemma.data`` stays cheap.
"""
