"""Every public name in core has a docstring, and every constructor argument has help text
that jsonargparse (which turns docstrings into `--help`) can find."""

import inspect

import docstring_parser
import pytest
from jsonargparse import ArgumentParser

import core.nn as core

PUBLIC = [getattr(core, name) for name in core.__all__]
CLASSES = [obj for obj in PUBLIC if inspect.isclass(obj)]


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_public_names_have_docstrings(obj):
    assert inspect.getdoc(obj), f"core.{obj.__name__} has no docstring"


def _documented_params(cls: type) -> set[str]:
    return {p.arg_name for p in docstring_parser.parse(inspect.getdoc(cls) or "").params}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_constructor_arguments_are_documented(cls):
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    missing = set(params) - _documented_params(cls)
    assert not missing, f"core.{cls.__name__} does not document {sorted(missing)} in its Args"


@pytest.mark.parametrize("cls", [core.Encoder, core.Decoder, core.WarmupCosineLR], ids=lambda c: c.__name__)
def test_jsonargparse_help_shows_docstrings(cls):
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "x", skip={"optimizer"})
    help_text = parser.format_help()
    for p in docstring_parser.parse(inspect.getdoc(cls)).params:
        if p.arg_name != "optimizer":
            first_words = " ".join(p.description.split()[:2])
            assert first_words in " ".join(help_text.split()), f"help for {p.arg_name} missing"
