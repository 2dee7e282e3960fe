"""User-facing errors: one line that says what is wrong and what to do (exit code 2)."""


class UserError(Exception):
    """A mistake the user can fix. The CLI prints `error: <message>` and exits 2."""
