"""Errors the core raises for client mistakes; http/app.py maps each to one HTTP status."""


class ClientError(Exception):
    code = "bad_request"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Invalid(ClientError):
    pass


class NotFound(ClientError):
    code, status = "not_found", 404


class Conflict(ClientError):
    code, status = "conflict", 409
