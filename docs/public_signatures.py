"""A griffe extension for the API reference (`mkdocs.yml`): a function made public with
`probekit.core.public.public` is shown with the signature and docstring it has at run time, its
options' defaults and help taken from their one declaration; everything else as its source
says (griffe reads the source, where such a function gives its options no default)."""

from __future__ import annotations

import inspect
from typing import Any

import griffe

KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


class PublicSignatures(griffe.Extension):
    """Run-time signatures and docstrings for the functions `public` made."""

    def on_function_instance(self, *, func: griffe.Function, agent: Any, **kwargs: Any) -> None:
        try:
            found = griffe.dynamic_import(func.path)
        except ImportError:
            return
        if not hasattr(found, "__public__"):
            return
        shown = inspect.signature(found).parameters.values()
        func.parameters = griffe.Parameters(*map(_parameter, shown))
        if found.__doc__:
            func.docstring = griffe.Docstring(
                inspect.cleandoc(found.__doc__),
                parent=func,
                parser=agent.docstring_parser,
                parser_options=agent.docstring_options,
            )


def _parameter(parameter: inspect.Parameter) -> griffe.Parameter:
    annotation = parameter.annotation
    return griffe.Parameter(
        parameter.name,
        annotation=None if annotation is parameter.empty else str(annotation),
        kind=KINDS[parameter.kind],
        default=None if parameter.default is parameter.empty else repr(parameter.default),
    )
