"""Version numbers shared by the build script and the package.

``build_ffi.py`` reads this file (without importing the package) and compiles
``BINDING_ABI`` and the llama.cpp commit into the extension; ``llama_cffi._binding``
compares them at import, so a stale ``_llama`` extension fails with a clear
``ImportError`` instead of crashing later.
"""

__version__ = "0.1.0"

#: Bump whenever build_ffi.py changes what the extension declares or exports
#: (the cdef rules, helper C code, extern "Python" callbacks).
BINDING_ABI = 35

#: llama.cpp commit this release is written and tested against.
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

#: The registry package that vendors exactly that commit, and its pinned digest.
LLAMA_CPP_SDIST = {
    "name": "llama_cpp_python-0.3.36.tar.gz",
    "url": (
        "https://files.pythonhosted.org/packages/ec/e9/"
        "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
        "llama_cpp_python-0.3.36.tar.gz"
    ),
    "sha256": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    "prefix": "llama_cpp_python-0.3.36",
}
