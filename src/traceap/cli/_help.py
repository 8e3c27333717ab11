"""How `traceap ... --help` is drawn: typer's rich help, adjusted in one place.

Typer's defaults suit short option lists; ours are long, so three things change:
- help text is literal: typer parses it as Rich markup, which silently drops anything that reads
  like a tag (`pip install traceap[ray]` printed as "pip install traceap");
- flags show no value placeholder (recent typer prints `--quiet <bool>`);
- the value column says what to give in one short word (`INT`, `PATH`, `TEXT`) instead of
  `<int range> [x>=1]` or `<list[Path]>`, which took up to 28 columns from the descriptions.
  A range worth knowing is said in the option's help; click still enforces it.
"""

from __future__ import annotations

import re

#: typer's type label (the text between `<` and `>`) -> the word the value column shows.
_TYPE_WORDS = {"int": "INT", "float": "NUM", "str": "TEXT", "path": "PATH", "Path": "PATH",
               "bool": "BOOL", "datetime": "TIME"}


def compact_type(label: str) -> str:
    """`<int range>` -> `INT`, `<list[Path]>` -> `PATH`, `<a|b>` -> `a|b`: the value in one word.

    A repeatable option shows its item type; its help says "repeatable".
    """
    inner = label.strip()
    if inner.startswith("<") and inner.endswith(">"):
        inner = inner[1:-1]
    inner = re.sub(r"^list\[(.*)\]$", r"\1", inner)
    inner = inner.removesuffix(" range")
    return _TYPE_WORDS.get(inner, inner)


def _patch_option_types() -> None:
    from typer.core import TyperArgument, TyperOption

    for cls in (TyperOption, TyperArgument):
        shown = getattr(cls, "display_type_rich", None)
        if shown is None or getattr(shown, "_traceap", False):
            continue

        def display_type_rich(self, ctx, _shown=shown):
            if getattr(self, "is_flag", False):
                return None          # a flag takes no value
            text = _shown(self, ctx)     # an option's metavar as given; an argument's type
            return None if text is None else compact_type(text)

        display_type_rich._traceap = True
        cls.display_type_rich = display_type_rich
        if hasattr(cls, "_get_number_range_help_str"):
            cls._get_number_range_help_str = lambda self: None


def _patch_literal_text() -> None:
    try:
        from rich.markup import escape
        from typer import rich_utils
    except ImportError:      # no rich: typer prints click's plain help, which parses nothing
        return
    made = getattr(rich_utils, "_make_rich_text", None)
    if made is None or getattr(made, "_traceap", False):
        return

    def _make_rich_text(*, text: str, style: str = "", markup_mode):
        if markup_mode == "rich":
            text = escape(text)
        return made(text=text, style=style, markup_mode=markup_mode)

    _make_rich_text._traceap = True
    rich_utils._make_rich_text = _make_rich_text


def install() -> None:
    """Apply the help adjustments (idempotent)."""
    _patch_option_types()
    _patch_literal_text()
