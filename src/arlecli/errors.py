"""User-facing errors: one line that says what is wrong and what to do (exit code 2)."""


class UserError(Exception):
    """A mistake the user can fix. The CLI prints `error: <message>` and exits 2."""


class ParamError(UserError):
    """A card param that its reward or env refuses; `param` names it (e.g. "tools[1]") so the
    card error can point at the field."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"param '{param}' {reason}")
        self.param = param
        self.reason = reason
