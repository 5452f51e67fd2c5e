"""Pure-Python (numpy) sampling and measurement over :class:`llama_cffi.Context`.

``llama_cffi`` never imports this package; it composes over ``llama_cffi``'s public API.
"""
