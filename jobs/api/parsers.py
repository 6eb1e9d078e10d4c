"""Request body parsers: JSON, and YAML job specs (``Content-Type: application/yaml`` or ``text/yaml``)."""

from __future__ import annotations

import yaml
from django.conf import settings
from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, answering 400 rather than 500 to a body nested too deeply to decode."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply.") from None


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a job spec never needs them, and they can multiply a small body."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str):
    """One YAML document with the safe types, or ParseError with the line and column of the problem."""
    try:
        return yaml.load(text, Loader=_SpecLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = ", ".join(p for p in (exc.context, exc.problem) if p) or "malformed document"
        raise exceptions.ParseError(f"YAML parse error{where}: {problem}.") from None
    except yaml.YAMLError as exc:
        raise exceptions.ParseError(f"YAML parse error: {exc}.") from None
    except RecursionError:
        raise exceptions.ParseError("YAML parse error: the document is nested too deeply.") from None


class YAMLParser(parsers.BaseParser):
    """A job spec in YAML (like mcli's run YAML): the same fields as the JSON body."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            raise exceptions.ParseError(f"YAML parse error: the body is not valid {encoding} text.") from None
        data = load_yaml(text)
        if data is None:
            raise exceptions.ParseError("YAML parse error: the document is empty.")
        return data


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"
