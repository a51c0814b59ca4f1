"""What the tests stand on, apart from the tests themselves: processes and
the gateway's harnesses, fakes of channels, the official SDKs' clients, the
test world's people and keys, and checks shared by several test files."""
