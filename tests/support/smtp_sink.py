"""A mail server on a loopback port that keeps what it is given: enough
SMTP (RFC 5321's EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT) for Django's
SMTP backend to deliver to it, so the console's mail is tested through a
real SMTP conversation rather than an in-memory backend."""

from __future__ import annotations

import email
import email.policy
import queue
import socketserver
import threading
from email.message import EmailMessage


class _Conversation(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.reply("220 sink ESMTP")
        recipients: list[str] = []
        while line := self.rfile.readline():
            verb = line.decode("ascii", "replace").strip().split(" ", 1)[0].upper()
            if verb == "EHLO":
                self.reply("250-sink\r\n250 8BITMIME")
            elif verb in ("HELO", "MAIL", "NOOP", "RSET"):
                recipients = [] if verb in ("MAIL", "RSET") else recipients
                self.reply("250 OK")
            elif verb == "RCPT":
                recipients.append(line.decode().split(":", 1)[1].strip().strip("<>"))
                self.reply("250 OK")
            elif verb == "DATA":
                self.reply("354 go on")
                self.server.received.put((recipients, self.message()))
                self.reply("250 kept")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 not here")

    def message(self) -> EmailMessage:
        lines = []
        while (line := self.rfile.readline()) not in (b".\r\n", b""):
            lines.append(line[1:] if line.startswith(b"..") else line)  # dot-unstuffing
        return email.message_from_bytes(b"".join(lines), policy=email.policy.default)

    def reply(self, text: str) -> None:
        self.wfile.write(text.encode() + b"\r\n")


class SmtpSink(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Conversation)
        self.received: queue.Queue[tuple[list[str], EmailMessage]] = queue.Queue()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def next_message(self, timeout: float = 10) -> tuple[list[str], EmailMessage]:
        return self.received.get(timeout=timeout)

    def close(self) -> None:
        self.shutdown()
        self.server_close()
