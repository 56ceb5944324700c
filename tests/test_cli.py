"""The ``spectune`` command group: every listed command has its module, nothing else is one."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from spectune.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_its_module(name: str) -> None:
    module_name, attr = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module_name), attr)
    assert isinstance(command, click.Command)
    assert main.get_command(click.Context(main), name) is command


def test_help_lists_exactly_the_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:")[1].split()
    assert [word for word in listed if word in COMMANDS] == sorted(COMMANDS)


def test_a_command_without_a_module_does_not_exist() -> None:
    """A name with no entry in COMMANDS (``bisect``: a plausible command, not built) is a
    usage error, not a silently hidden entry."""
    assert "bisect" not in COMMANDS
    result = CliRunner().invoke(main, ["bisect"])
    assert result.exit_code == 2
    assert "No such command 'bisect'" in result.output


def test_doctor_vllm_seams_takes_an_optional_path(tmp_path) -> None:
    """``--vllm-seams`` alone checks the installed vLLM; with a value, that tree; a path
    holding no vLLM is a usage error naming it. (The checks themselves:
    tests/vllm/test_seams.py.)"""
    doctor = main.get_command(click.Context(main), "doctor")
    assert doctor is not None
    option = next(p for p in doctor.params if p.name == "seams_path")
    assert isinstance(option, click.Option) and option.flag_value == "" and not option.is_flag
    assert "--vllm-seams [PATH]" in CliRunner().invoke(main, ["doctor", "--help"]).output
    result = CliRunner().invoke(main, ["doctor", "--vllm-seams", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no vllm package" in result.output and str(tmp_path) in result.output
