"""imqbridgemgr admin subcommands: the original's option rules, prompts and output.

End-to-end runs against a live service are in tests/test_service_e2e.py; these check
what the CLI decides before and after talking to it.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bridgemgr.admin.protocol import OK, Reply
from bridgemgr.admincli import render_list
from bridgemgr.cli import main


@pytest.mark.parametrize(
    "args, error",
    [
        (["start", "bridge"], "needs -bn"),
        (["start", "bridge", "-bn", "b", "-ln", "l"], "-ln is not allowed with 'bridge'"),
        (["list", "link"], "needs -bn"),
        (["stop", "link", "-bn", "b"], "needs -ln"),
        (["pause", "bridge", "-t", "stomp"], "cannot be paused"),
        (["start", "link", "-t", "STOMP", "-bn", "x", "-ln", "y"], "has no links"),
        (["list", "bridge", "-t", "stomp", "-bn", "stomp"], "not supported for the STOMP bridge"),
        (["start", "queue"], "Invalid value"),
        (["list", "bridge", "-b", "nocolon", "-u", "a", "-passfile", "/dev/null"], "host:port"),
    ],
)
def test_usage_rules_of_the_original(args, error):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert error in result.output


def test_without_f_a_command_asks_and_n_does_nothing():
    result = CliRunner().invoke(main, ["stop", "bridge", "-bn", "b1"], input="n\n")
    assert "Are you sure you want to perform operation [stop] on this bridge ? (y/n)[n]" in result.output
    assert "was not performed" in result.output
    assert result.exit_code == 0


def test_passfile_must_set_the_password_key(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("something.else=x\n")
    result = CliRunner().invoke(main, ["list", "bridge", "-u", "admin", "-passfile", str(pw)])
    assert result.exit_code == 1
    assert "does not set imq.imqbridgemgr.password" in result.output


def test_service_down_is_a_clear_failure(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("imq.imqbridgemgr.password=x\n")
    result = CliRunner().invoke(main, ["list", "bridge", "-b", "127.0.0.1:1", "-u", "admin", "-passfile", str(pw)])
    assert result.exit_code == 1
    assert "cannot reach the broker at 127.0.0.1:1" in result.output


def test_help_with_examples():
    result = CliRunner().invoke(main, ["list", "-H"])
    assert result.exit_code == 0 and "imqbridgemgr list bridge -b localhost:7676" in result.output


def test_list_tables_have_the_original_layout():
    reply = Reply(
        OK,
        "ok",
        {
            "bridges": [
                {"name": "zeta", "type": "JMS", "state": "STOPPED"},
                {"name": "stomp", "type": "STOMP", "state": "STARTED"},
            ]
        },
    )
    text = render_list(reply, "bridge", None, None)
    lines = text.splitlines()
    assert set(lines[0]) == {"-"} and lines[1].split() == ["Bridge", "Name", "Bridge", "Type", "Bridge", "State"]
    assert set(lines[2]) == {"-"}
    assert lines[3].split() == ["stomp", "STOMP", "STARTED"] and lines[4].split() == ["zeta", "JMS", "STOPPED"]
    assert lines[5] == ""
    assert lines[6] == "The operation [list] on the bridge(s) was successful."


def test_list_bridge_with_links_and_list_link_counters():
    data = {
        "bridge": {"name": "b1", "type": "JMS", "state": "STARTED"},
        "links": [
            {
                "name": "l2",
                "state": "PAUSED",
                "source": "cf1:D:queue:a",
                "target": "cf2:P:topic:b",
                "transacted": False,
                "counters": {"transferred": 7, "to_dmq": 1, "last_error": None},
            },
            {
                "name": "l1",
                "state": "STARTED",
                "source": "cf1:S:queue:x",
                "target": "cf2:D:queue:y",
                "transacted": True,
                "counters": {"transferred": 3, "to_dmq": 0, "last_error": "boom"},
            },
        ],
    }
    text = render_list(Reply(OK, "ok", data), "bridge", "b1", None)
    assert "Links" in text.splitlines()[1] and text.splitlines()[3].split() == ["b1", "JMS", "STARTED", "2"]
    link_lines = [x.split() for x in text.splitlines() if x.startswith("l")]
    assert link_lines[0][:5] == ["l1", "STARTED", "cf1:S:queue:x", "cf2:D:queue:y", "true"]
    text = render_list(Reply(OK, "ok", data), "link", "b1", "l2")
    # the original's five columns by default: scripts that parse them keep working
    assert text.splitlines()[1].split("  ")[:1] == ["Link Name"] and "Transferred" not in text
    assert [x.split() for x in text.splitlines() if x.startswith("l2")] == [
        ["l2", "PAUSED", "cf1:D:queue:a", "cf2:P:topic:b", "false"]
    ]
    text = render_list(Reply(OK, "ok", data), "link", "b1", "l2", verbose=True)
    assert "Transferred" in text and "l1" not in text
    assert text.strip().endswith("The operation [list] on the link(s) was successful.")
    titles = text.splitlines()[1]
    assert titles.index("Transferred") < titles.index("Rate/s") < titles.index("Backlog") < titles.index("Last Error")
    row = next(x.split() for x in text.splitlines() if x.startswith("l2"))
    assert row[5:] == ["7", "1", "0", "0.0", "-", "-"]  # no backlog known, no error


@pytest.mark.parametrize(
    "args, error",
    [
        (["pause", "dst", "-t", "q"], "takes -t and -n together"),
        (["resume", "dst", "-n", "orders"], "takes -t and -n together"),
        (["pause", "bridge", "-bn", "b", "-pst", "ALL"], "-n and -pst are for pause dst and resume dst"),
        (["pause", "dst", "-pst", "SOME"], "Invalid value"),
        (["list", "bridge", "-tmp"], "-tmp is for list dst"),
        (["list", "dst", "-svn", "jms"], "-svn is for list cxn"),
        (["list", "cxn", "-bn", "b"], "list cxn takes no -bn, -ln or -t"),
        (["destroy", "dst", "-t", "q"], "Missing option '-n'"),
        (["destroy", "dst", "-t", "x", "-n", "y"], "Invalid value"),
    ],
)
def test_usage_rules_of_the_destination_commands(args, error):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert error in result.output


@pytest.mark.parametrize(
    "args, asked",
    [
        (["destroy", "dst", "-t", "q", "-n", "orders"], "[destroy] on this destination"),
        (["pause", "dst", "-t", "t", "-n", "news", "-pst", "consumers"], "[pause] on this destination"),
        (["resume", "dst"], "[resume] on all destinations"),
    ],
)
def test_destroy_pause_and_resume_ask_and_n_does_nothing(args, asked):
    result = CliRunner().invoke(main, args, input="n\n")
    assert f"Are you sure you want to perform operation {asked} ? (y/n)[n]" in result.output
    assert "was not performed" in result.output and result.exit_code == 0


def test_nocheck_is_accepted_as_the_original_takes_it(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("imq.imqbridgemgr.password=x\n")
    for args in (["list", "bridge"], ["list", "dst"], ["stop", "bridge", "-bn", "b", "-f"]):
        result = CliRunner().invoke(main, [*args, "-nocheck", "-b", "127.0.0.1:1", "-u", "admin", "-passfile", str(pw)])
        assert result.exit_code == 1, result.output  # it got as far as the (absent) service
        assert "cannot reach the broker at 127.0.0.1:1" in result.output
