"""Makes lm-eval's own command find the ``llama-cffi`` model: ``lm_eval --model llama-cffi
--model_args model=PATH.gguf --tasks TASK``.

lm-eval (0.4) finds models only in its registry (``lm_eval.api.registry.model_registry``),
filled when ``lm_eval.models`` is imported; it has no plugin entry points. The installed
package therefore carries a copy of this module at the top of site-packages
(``_llama_cffi_lm_eval``) and a ``llama_cffi-lm-eval.pth`` file whose one line imports it
at interpreter start-up (``setup.py``'s ``write_hook``; the copy is byte-compiled at install,
so start-up only loads its bytecode). It imports nothing (``sys`` and ``os`` are loaded
already) and does nothing until ``lm_eval.models`` is imported: then, once that module
has run, it adds ``llama-cffi`` to the registry as a lazy placeholder,
``samplers.harness:LlamaCffiLM`` (so llama_cffi is imported only when lm-eval asks for
that model). Every failure here is swallowed: a start-up hook must never
break an interpreter. ``LLAMA_CFFI_LM_EVAL_HOOK=0`` turns it off.

PYTEST_DONT_REWRITE: the distribution has a pytest plugin, so pytest would mark this
top-level module for assertion rewriting, and warn in every session that it was imported
(at start-up) before it could be rewritten.
"""

import sys

TYPE_CHECKING = False  # typing is not imported at start-up; mypy reads the names below
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


def _install() -> None:
    if __import__("os").environ.get("LLAMA_CFFI_LM_EVAL_HOOK", "1").strip() == "0":
        return

    def _register() -> None:
        try:
            from lm_eval.api.registry import model_registry

            if "llama-cffi" not in model_registry:
                model_registry.register("llama-cffi", target="samplers.harness:LlamaCffiLM")
        except Exception:  # a start-up hook must not break lm-eval
            pass

    class LlamaCffiLmEvalFinder:
        """A meta path finder that answers only for ``lm_eval.models``: the spec the path
        finder gives, with the loader's ``exec_module`` followed by the registration."""

        @classmethod
        def find_spec(
            cls, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
        ) -> "ModuleSpec | None":
            if name != "lm_eval.models":
                return None
            try:
                from importlib.machinery import PathFinder  # here, not at start-up (it costs an import)

                spec = PathFinder.find_spec(name, path)
                loader = getattr(spec, "loader", None)
                run = getattr(loader, "exec_module", None)
                if run is None:
                    return None

                def exec_module(module: object) -> None:
                    run(module)
                    _register()

                loader.exec_module = exec_module  # type: ignore[union-attr]  # this module's own loader
                return spec
            except Exception:  # the normal import then proceeds
                return None

    if not any(getattr(f, "__name__", "") == "LlamaCffiLmEvalFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, LlamaCffiLmEvalFinder)
    if "lm_eval.models" in sys.modules:  # imported already (this code run late, by hand)
        _register()


_install()
