"""Prompt files: Spec-Bench JSONL, JSONL with "prompt", plain text; line-numbered errors; selection."""

import pytest

from tr_cli.errors import UserError
from tr_cli.text.prompts import PromptRecord, load_prompts, read_prompt_file, select_prompts


def test_three_prompt_formats(tmp_path):
    spec = tmp_path / "spec.jsonl"
    spec.write_text(
        '{"question_id": 7, "category": "qa", "turns": ["A?", "B?"]}\n\n'
        '{"question_id": 8, "category": "rag", "turns": ["C"]}\n'
    )
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "Hello"}\n{"prompt": "World", "category": "x", "id": "w"}\n')
    text = tmp_path / "prompts.txt"
    text.write_text("First prompt\nstill first.\n\n\nSecond prompt.\n")
    assert read_prompt_file(spec) == [PromptRecord("7", "qa", ("A?", "B?")), PromptRecord("8", "rag", ("C",))]
    assert read_prompt_file(plain) == [PromptRecord("1", "default", ("Hello",)), PromptRecord("w", "x", ("World",))]
    assert [r.turns for r in read_prompt_file(text)] == [("First prompt\nstill first.",), ("Second prompt.",)]
    bundled = load_prompts(None)
    assert len(bundled) >= 10 and len({r.category for r in bundled}) >= 6


@pytest.mark.parametrize(
    "content, line, words",
    [
        ('{"turns": ["ok"]}\n{"turns": ["ok"]\n', 2, "not valid JSON"),
        ('{"turns": ["ok"]}\n\n{"turns": []}\n', 3, "non-empty list"),
        ('{"question": "x"}\n', 1, 'expected a "turns" list'),
        ("[1, 2]\n", 1, "expected a JSON object"),
        # Both were 'unexpected RecursionError' / 'unexpected ValueError' (issue 43's serve body, in a file)
        ('{"turns": ["ok"]}\n{"turns": ["ok"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", 2, "nested too deeply"),
        ('{"turns": ["ok"], "x": ' + "9" * 5000 + "}\n", 1, "not valid JSON (Exceeds the limit (4300 digits)"),
    ],
)
def test_bad_prompt_files_name_the_line(tmp_path, content, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError) as info:
        read_prompt_file(path)
    assert f"{path}:{line}:" in str(info.value) and words in str(info.value)


def test_select_prompts_filters_in_order():
    records = [PromptRecord(str(i), cat, ("x",)) for i, cat in enumerate("aabbbca")]
    assert [r.id for r in select_prompts(records, [], 1, None, "f")] == ["0", "2", "5"]
    assert [r.id for r in select_prompts(records, ["a", "c"], None, None, "f")] == ["0", "1", "5", "6"]
    assert [r.id for r in select_prompts(records, ["b"], 2, 1, "f")] == ["2"]
    with pytest.raises(UserError, match="z not in f"):
        select_prompts(records, ["z"], None, None, "f")


def test_a_fifo_is_read_as_a_prompt_file(tmp_path):
    """`tr bench <(...)` hands over /dev/fd/N, a pipe: it used to be "no such prompt file"."""
    import os
    import threading

    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "w") as f:
            f.write('{"question_id": "a", "category": "qa", "turns": ["Hi?"]}\n')

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert read_prompt_file(fifo) == [PromptRecord("a", "qa", ("Hi?",))]
    finally:
        writer.join(timeout=10)


def test_a_directory_is_not_a_prompt_file(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        read_prompt_file(tmp_path)
