"""Dataclass fields as command-line flags, both ways: the machinery of tandem/options.py's process options."""

from __future__ import annotations

import argparse
import functools
from dataclasses import MISSING, Field, field, fields
from enum import Enum
from typing import Annotated, Any, ClassVar, Self, Union, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo


def opt(
    default: Any = MISSING,
    help: str = "",
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    factory: Any = MISSING,
) -> Any:
    """A field that is also a flag: `--field-name` unless `flag` names it (a flag older than the field)."""
    meta = {"help": help, "flag": flag, "choices": choices}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _addresses(value: str) -> list[str]:
    """`host:port[,host:port...]` -> a list, empty entries dropped."""
    return [a.strip() for a in value.split(",") if a.strip()]


def kind_of(annotation: Any) -> type:
    """`int | None` -> int; `list[str]` -> list."""
    if get_origin(annotation) in (Union, type(int | None)):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return get_origin(annotation) or annotation


def _flag(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _spec_value(name: str, info: FieldInfo) -> Any:
    """An argparse type for a spec field: the text checked and converted as the spec would (constraints
    too)."""
    kind: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    adapter: TypeAdapter[Any] = TypeAdapter(kind)

    def convert(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e.errors()[0]['msg']}") from None

    convert.__name__ = name  # argparse names the type in its message
    return convert


def _spec_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value.value if isinstance(value, Enum) else value)


def spec_defaults(cls: type[Options]) -> dict[str, Any]:
    return {name: info.get_default(call_default_factory=True) for name, info in cls._spec_flags().items()}


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[Field, type], ...]:
    """A class's fields and their kinds, resolved once (the operator renders argv for every reconcile)."""
    hints = get_type_hints(cls)
    return tuple((f, kind_of(hints[f.name])) for f in fields(cls) if f.name != "engine_knobs")  # type: ignore[arg-type]


class Options:
    """Flags from fields, both ways; a class may add flags from spec fields it does not declare
    (`_spec_flags`), carried in its `engine_knobs` mapping."""

    PROG: ClassVar[str]
    DESCRIPTION: ClassVar[str]

    @classmethod
    def _fields(cls) -> tuple[tuple[Field, type], ...]:
        return _fields_of(cls)  # type: ignore[arg-type]  # a class hashes; mypy reads its instances

    @classmethod
    def _spec_flags(cls) -> dict[str, FieldInfo]:
        return {}

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=cls.PROG, description=cls.DESCRIPTION)
        for f, kind in cls._fields():
            required = f.default is MISSING and f.default_factory is MISSING
            default = None if required else (f.default if f.default is not MISSING else f.default_factory())  # type: ignore[misc]
            help_ = f.metadata.get("help", "") + (
                "" if required or default in (None, False, []) else f" (default: {default})"
            )
            kw: dict[str, Any] = {"dest": f.name, "help": help_.strip() or None}
            if kind is bool:
                kw["action"] = "store_true"
            elif kind is list:
                kw.update(type=_addresses, default=default)
            elif issubclass(kind, Enum):
                kw.update(choices=[m.value for m in kind], default=None if default is None else default.value)
            else:
                kw.update(type=kind, default=default, choices=f.metadata.get("choices"))
            p.add_argument(_flag(f), required=required, **kw)
        for name, info in cls._spec_flags().items():
            default = info.get_default(call_default_factory=True)
            p.add_argument(
                "--" + name.replace("_", "-"),
                dest=name,
                type=_spec_value(name, info),
                default=default,
                help=(info.description or "") + f" (default: {_spec_text(default)})",
            )
        return p

    @classmethod
    def from_argv(cls, argv: list[str]) -> Self:
        return cls.from_namespace(cls.parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> Self:
        values = {}
        for f, kind in cls._fields():
            v = getattr(ns, f.name)
            values[f.name] = kind(v) if v is not None and issubclass(kind, Enum) else v
        if cls._spec_flags():
            values["engine_knobs"] = {name: getattr(ns, name) for name in cls._spec_flags()}
        return cls(**values)

    def to_argv(self) -> list[str]:
        """Every flag that is set, defaults included (what a pod runs reads the same whatever the image's
        defaults); a None, False or empty value is the flag left out."""
        argv: list[str] = []
        for f, _ in self._fields():
            v = getattr(self, f.name)
            if v is None or v is False or v == []:
                continue
            if v is True:
                argv.append(_flag(f))
            else:
                argv += [_flag(f), ",".join(v) if isinstance(v, list) else str(v)]
        knobs: dict[str, Any] = getattr(self, "engine_knobs", {})
        for name in self._spec_flags():
            if knobs.get(name) is not None:
                argv += ["--" + name.replace("_", "-"), _spec_text(knobs[name])]
        return argv
