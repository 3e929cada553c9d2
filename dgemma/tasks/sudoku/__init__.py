"""Sudoku: puzzle generation and solving (``puzzles``), CSV formats (``formats``), the digit-vocabulary and the
official text encodings with their grain training pipelines (``digits``, ``text``), solving with a trained model
(``solving``), the in-training evaluator (``evaluation``), the grid display (``display``) and the two tasks of
the registry, ``sudoku_digits`` and ``sudoku_text`` (``task``).

Submodules are not imported here so that importing one stays cheap.
"""
