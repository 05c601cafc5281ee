"""Checks on the test suite itself (CPU, runs in CI).

A module that defines two tests with the same name keeps only the last one:
pytest never collects the first, and nothing fails. This happened once to the
sm90 ordinary-mode GPU test, so every test module is checked here.
"""
import ast
import collections
import pathlib

import pytest

TEST_FILES = sorted(pathlib.Path(__file__).parent.glob("test_*.py"))


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_no_shadowed_definitions(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    names = collections.Counter(node.name for node in tree.body
                                if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    repeated = sorted(name for name, count in names.items() if count > 1)
    assert not repeated, f"{path.name} defines {repeated} more than once; only the last definition runs"
