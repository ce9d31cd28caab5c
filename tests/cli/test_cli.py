"""CLI behaviour that needs no cluster: output files that cannot be written are usage errors."""

from __future__ import annotations

import pytest

from preflight import cli


@pytest.mark.parametrize("flag", ["--junit", "--prometheus", "--history", "--json", "--env-file", "--hostfile", "--html"])
def test_unwritable_output_is_one_line_exit_2(tmp_path, capsys, flag):
    (tmp_path / "a-file").write_text("")
    target = str(tmp_path / "a-file" / "out")  # below a regular file: no writer can create it
    rc = cli.main(["check", "--only", "ssh", "--no-progress", flag, target])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "preflight: error: cannot write %s: Not a directory; check the directory exists and is writable" % target
    )
