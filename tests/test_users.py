"""The user repository (salted scrypt hashes, groups, atomic edits) and `imqbridgemgr user`."""

from __future__ import annotations

import os
import stat
import threading

import pytest
from click.testing import CliRunner

from bridgemgr.cli import main
from bridgemgr.props import load_properties
from bridgemgr.users import (
    UserRepository,
    UserRepositoryError,
    default_path,
    hash_password,
    open_repository,
    verify_password,
)


@pytest.fixture
def repo(tmp_path):
    return UserRepository(tmp_path / "etc" / "passwd")


def test_passwords_are_stored_only_as_salted_slow_hashes(repo):
    repo.add("alice", "correct horse", "admin")
    repo.add("bob", "correct horse")
    text = repo.path.read_text()
    assert "correct horse" not in text
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    hashes = [line.split(":")[2] for line in lines]
    assert all(h.startswith("scrypt$14$8$1$") for h in hashes)
    assert hashes[0] != hashes[1]  # different salts
    assert stat.S_IMODE(os.stat(repo.path).st_mode) == 0o600


@pytest.mark.slow
def test_authenticate(repo):
    repo.add("alice", "pw", "admin")
    assert repo.authenticate("alice", "pw").group == "admin"
    assert repo.authenticate("alice", "PW") is None
    assert repo.authenticate("nobody", "pw") is None
    assert repo.authenticate(None, "pw") is None and repo.authenticate("alice", None) is None
    assert repo.authenticate("alice", "pw").name == "alice"  # cached path


def test_a_changed_file_forgets_cached_logins(repo, tmp_path):
    repo.add("alice", "old")
    assert repo.authenticate("alice", "old")
    UserRepository(repo.path).add("alice", "new", replace=True)  # another process, say
    assert repo.authenticate("alice", "old") is None
    assert repo.authenticate("alice", "new")


def test_verified_knows_only_credentials_authenticate_passed_since_the_file_changed(repo):
    repo.add("alice", "old")
    assert repo.verified("alice", "old") is None  # not checked yet: it never hashes
    assert repo.authenticate("alice", "old") and repo.verified("alice", "old").name == "alice"
    assert repo.verified("alice", "OLD") is None and repo.verified("nobody", "old") is None
    UserRepository(repo.path).add("alice", "new", replace=True)
    assert repo.verified("alice", "old") is None and repo.verified("alice", "new") is None


def test_add_delete_list_and_their_errors(repo):
    repo.add("a", "1", "user")
    repo.add("b", "2", "admin")
    assert [(u.name, u.group) for u in repo.users()] == [("a", "user"), ("b", "admin")]
    with pytest.raises(UserRepositoryError, match="already exists"):
        repo.add("a", "x")
    with pytest.raises(UserRepositoryError, match="group"):
        repo.add("c", "x", "root")
    with pytest.raises(UserRepositoryError, match="not a usable user name"):
        repo.add("c:d", "x")
    with pytest.raises(UserRepositoryError, match="must not be empty"):
        repo.add("c", "")
    repo.delete("a")
    with pytest.raises(UserRepositoryError, match="does not exist"):
        repo.delete("a")
    assert [u.name for u in repo.users()] == ["b"]


@pytest.mark.slow
def test_concurrent_edits_lose_nothing(repo):
    threads = [threading.Thread(target=repo.add, args=(f"u{i}", "pw")) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(UserRepository(repo.path).users()) == 8


def test_a_broken_line_names_file_and_line(repo):
    repo.path.parent.mkdir(parents=True)
    repo.path.write_text("# comment\nalice:admin:plaintext\n")
    with pytest.raises(UserRepositoryError, match=r"passwd:2: not a user line"):
        repo.users()


def test_verify_password_rejects_malformed_hashes():
    good = hash_password("x", log_n=4)
    assert verify_password("x", good) and not verify_password("y", good)
    for bad in ("", "md5$1$2", "scrypt$a$b$c$d$e", "scrypt$4$8$1$zz$00"):
        assert not verify_password("x", bad)


def test_the_default_file_and_the_admin_bootstrap(tmp_path):
    props = load_properties(
        [], [f"imq.varhome={tmp_path}", "imq.bridge.admin.user=admin", "imq.bridge.admin.password=adminpw"], environ={}
    )
    assert default_path(props) == tmp_path / "instances" / "imqbroker" / "etc" / "passwd"
    repo = open_repository(props)
    assert repo.authenticate("admin", "adminpw").group == "admin"
    repo.add("other", "pw")
    repo.delete("admin")
    assert not UserRepository(repo.path).ensure_admin("admin", "adminpw")  # not empty: left alone
    elsewhere = load_properties([], [f"imq.user_repository.file={tmp_path / 'users.txt'}"], environ={})
    assert default_path(elsewhere) == tmp_path / "users.txt"


# --- imqbridgemgr user ---------------------------------------------------------------------------


@pytest.fixture
def props_file(tmp_path):
    path = tmp_path / "broker.properties"
    path.write_text(f"imq.varhome={tmp_path / 'var'}\n")
    return path


def test_cli_add_list_delete_with_a_passfile(tmp_path, props_file):
    passfile = tmp_path / "pw.properties"
    passfile.write_text("imq.imqusermgr.password=s3cret\n")
    runner = CliRunner()
    result = runner.invoke(
        main, ["user", "add", "-props", str(props_file), "-u", "carol", "-passfile", str(passfile), "-g", "admin"]
    )
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    repo = UserRepository(tmp_path / "var" / "instances" / "imqbroker" / "etc" / "passwd")
    assert repo.authenticate("carol", "s3cret").group == "admin"
    listed = runner.invoke(main, ["user", "list", "-props", str(props_file)])
    assert listed.exit_code == 0 and "carol" in listed.output and "admin" in listed.output
    assert "scrypt" not in listed.output
    again = runner.invoke(main, ["user", "add", "-props", str(props_file), "-u", "carol", "-passfile", str(passfile)])
    assert again.exit_code == 1 and "already exists" in again.output
    gone = runner.invoke(main, ["user", "delete", "-props", str(props_file), "-u", "carol"])
    assert gone.exit_code == 0 and repo.users() == []
    missing = runner.invoke(main, ["user", "delete", "-props", str(props_file), "-u", "carol"])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_cli_prompts_for_the_password_without_echo(tmp_path, props_file):
    result = CliRunner().invoke(main, ["user", "add", "-props", str(props_file), "-u", "dave"], input="pw-1\npw-1\n")
    assert result.exit_code == 0, result.output
    assert "pw-1" not in result.output
    repo = UserRepository(tmp_path / "var" / "instances" / "imqbroker" / "etc" / "passwd")
    assert repo.authenticate("dave", "pw-1").group == "user"
    mismatch = CliRunner().invoke(main, ["user", "add", "-props", str(props_file), "-u", "erin"], input="a\nb\n")
    assert mismatch.exit_code != 0 and repo.get("erin") is None


def test_cli_passfile_without_the_key(tmp_path, props_file):
    passfile = tmp_path / "pw"
    passfile.write_text("something.else=1\n")
    result = CliRunner().invoke(main, ["user", "add", "-props", str(props_file), "-u", "x", "-passfile", str(passfile)])
    assert result.exit_code == 1 and "imq.imqusermgr.password" in result.output
