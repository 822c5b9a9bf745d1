"""Schemathesis hooks for scripts/schema-test.

A key is 1 to 512 *bytes* of UTF-8 (docs/api.md), but JSON Schema can only bound a string's
length in characters: docs/openapi.json says `maxLength: 512`, which is right for ASCII keys
and too generous for keys of multi-byte characters. A key of at most 512 characters but more
than 512 bytes is valid for the document and correctly refused by the server (400, "`key`
must be 1 to 512 bytes"), so the positive_data_acceptance check would report the document's
blind spot as a server fault. These hooks drop exactly those generated keys, in bodies and
in the path of DELETE /v1/keys/{policy}/{key}; every other value, valid or not, is sent.
The refusal itself is tested in crates/sluice-server/tests/api/http.rs.
"""

import schemathesis

MAX_KEY_BYTES = 512


def describable(key):
    """False only for a key the schema calls valid but the server must refuse."""
    if not isinstance(key, str) or len(key) > MAX_KEY_BYTES:
        return True
    return len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES


@schemathesis.hook
def filter_body(context, body):
    return not isinstance(body, dict) or describable(body.get("key"))


@schemathesis.hook
def filter_path_parameters(context, path_parameters):
    return not isinstance(path_parameters, dict) or describable(path_parameters.get("key"))
