"""Data layer: Sudoku generation/solving (``sudoku``), CSV formats (``sudoku_formats``)
and model-example encoding plus the grain training pipeline (``sudoku_task``).

Submodules are not imported here so that ``import dgemma.data`` stays cheap.
"""
