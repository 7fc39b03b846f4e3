"""The language's syntax, shared by every pass: the reader's data with their positions
(`read`), source forms printed back short (`echo`), and compile-time scalars (`scalars`).
"""
