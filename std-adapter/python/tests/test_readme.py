"""The README's "Use from vLLM" example runs and reproduces vLLM's digest."""

import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_readme_example_runs(monkeypatch, capsys):
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Use from vLLM", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "vllm:kv_offload_cpu_cache_usage_perc" in out
