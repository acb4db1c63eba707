"""The Python blocks of the README and docs/ run: the offloading spec's example reproduces
vLLM's digest (here), the simple connector's stores and finds two blocks
(test_simple_scheduler.py), and no other Python block exists untested."""

import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Each Markdown file with Python blocks, and how many: the tests that run them are named above.
RUN = {"docs/vllm.md": 1, "docs/simple-offloader.md": 1}


def python_blocks(path):
    """The ```python blocks of a Markdown file under the repository root, in order."""
    text = open(os.path.join(ROOT, path)).read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_example_runs(monkeypatch, capsys):
    (code,) = python_blocks("docs/vllm.md")
    monkeypatch.chdir(ROOT)
    exec(compile(code, "docs/vllm.md", "exec"), {})
    out = capsys.readouterr().out
    assert "vllm:kv_offload_cpu_cache_usage_perc" in out


def test_every_python_block_runs():
    found = {}
    paths = ["README.md"] + glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True)
    for path in sorted(paths):
        n = len(python_blocks(path))
        if n:
            found[path] = n
    assert found == RUN
