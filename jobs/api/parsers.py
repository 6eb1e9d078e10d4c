from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, answering 400 rather than 500 to a body nested too deeply to decode."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply.") from None
