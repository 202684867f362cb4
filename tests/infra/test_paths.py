"""Following a path a user hands in: a NUL byte, a loop, a dangling link and a link out of a
folder are each said in words, on one line."""

from __future__ import annotations

import os

from infra.paths import follow, links_out_of, shown


def test_what_cannot_be_followed_says_why(tmp_path):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    assert follow(tmp_path / "loop") == (None, "is a symlink loop (it leads back to itself)")
    assert follow(tmp_path / "dangling") == (None, f"is a symlink to {tmp_path / 'gone'}, which "
                                             "does not exist")
    assert follow(tmp_path / "nothing") == (None, "does not exist")
    assert follow(tmp_path / "a\x00b")[1].startswith("holds a NUL byte (\\x00)")
    assert follow(tmp_path / "a\nb")[1] == "holds a line break; write the path on one line"


def test_a_link_is_followed_to_where_it_leads(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert follow(tmp_path / "link") == (tmp_path / "real", None)


def test_links_out_of_a_folder_are_found_and_links_inside_are_not(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (tmp_path / "secret").write_text("x")
    os.symlink(folder / "config.json", folder / "alias.json")  # inside: fine
    os.symlink(tmp_path / "secret", folder / "sub" / "notes.txt")
    os.symlink(tmp_path, folder / "up")  # a folder out: not walked into
    os.symlink(folder / "gone", folder / "dangling")
    assert links_out_of(folder) == [(folder / "dangling", None), (folder / "sub" / "notes.txt",
                                    tmp_path / "secret"), (folder / "up", tmp_path)]


def test_control_characters_are_shown_as_escapes():
    assert shown("/m/w\x004\n") == "/m/w\\x004\\n"
