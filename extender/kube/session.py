"""How the Kubernetes adapter's connections to the API server are set up, once, at connect: the
proxy the environment names for the server, a generated client's HTTP session that no longer
reads the environment on every request, and the keep-alive client for writes with the TLS
settings of the generated client's session.

Writes (Bindings, Events, node patches) skip the generated client: the adapter sends the body,
encoded once with orjson, with the client's own credentials (`update_params_for_auth`, which
refreshes expiring tokens) and TLS settings, on `extender.kube.http11`'s keep-alive connections
(through a proxy, on the client's own aiohttp session and its proxy settings). Around one
Binding the generated layers do more work than the HTTP exchange itself: a deep copy of the body
(`sanitize_for_serialization`), the standard library's JSON encoder, header sanitising, a
regular expression on the Content-Type and two timeout objects; and aiohttp's session costs
more than the exchange does on keep-alive connections of its own.
"""

from __future__ import annotations

import base64
import ssl
import urllib.parse
import urllib.request
from typing import Final

import aiohttp
from kubernetes_asyncio import client

from extender.kube.http11 import MAX_CONNECTIONS, Http11Client

#: Bytes of the HTTP session's read buffer (kubernetes-asyncio's: etcd takes objects of up to
#: 1.5 MiB, and one watch event carries a whole object).
READ_BUFSIZE: Final = 2**21


def env_proxy(url: str) -> tuple[str, str | None] | None:
    """The proxy the environment names for `url` (HTTP_PROXY / HTTPS_PROXY by the URL's
    scheme, NO_PROXY exempting hosts, as urllib and aiohttp read them), without its user info,
    with the Proxy-Authorization value that user info makes; or None. HTTPS proxies are left
    out, as aiohttp's own lookup leaves them. Run it off the event loop: it reads the
    environment (tens of thousands of service variables in a big cluster)."""
    target = urllib.parse.urlsplit(url)
    host = target.hostname
    if not host or urllib.request.proxy_bypass(host):
        return None
    named = urllib.request.getproxies().get(target.scheme)
    if not named:
        return None
    proxy = urllib.parse.urlsplit(named)
    if proxy.scheme != "http" or not proxy.hostname:
        return None
    where = proxy.hostname + (f":{proxy.port}" if proxy.port else "")
    plain = urllib.parse.urlunsplit(("http", where, proxy.path, "", ""))
    if proxy.username is None:
        return plain, None
    user = urllib.parse.unquote(proxy.username)
    password = urllib.parse.unquote(proxy.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return plain, f"Basic {token}"


def look_up_environment_once(api: client.ApiClient, proxy: tuple[str, str | None] | None) -> None:
    """Make `api`'s HTTP session stop reading the environment on every request.

    kubernetes-asyncio opens its session with `trust_env=True`, and aiohttp then looks up
    ~/.netrc in an executor thread and the proxy variables in another, for every request: two
    thread round trips and a file read per Binding, several times the cost of the bind itself
    against a local API server. The API server's address does
    not change, so its proxy (`env_proxy`, looked up once at connect) is set on the client,
    which passes it on every request, and the session is replaced by one over the same
    connector that does not look again. A proxy named in the kubeconfig (`proxy-url`) wins;
    netrc never held Kubernetes credentials."""
    rest = api.rest_client
    old = rest.pool_manager
    if not old.trust_env:
        return
    if proxy is not None and not rest.proxy:
        rest.proxy, authorization = proxy
        if authorization is not None:
            rest.proxy_headers = {
                **(rest.proxy_headers or {}),
                "Proxy-Authorization": authorization,
            }
    # The same read buffer as kubernetes-asyncio's: watch events of large objects exceed
    # aiohttp's default.
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )
    old.detach()  # closed, its connector now the new session's


def write_client(api: client.ApiClient) -> Http11Client:
    """The client for the adapter's writes to `api`'s server, with the TLS settings the
    generated client's session has: its CA, client certificate, verification switches and
    server name, applied as kubernetes-asyncio's `RESTClientObject` applies them."""
    conf = api.configuration
    host = str(conf.host)
    context: ssl.SSLContext | None = None
    if urllib.parse.urlsplit(host).scheme == "https":
        context = ssl.create_default_context(cafile=conf.ssl_ca_cert)
        if conf.cert_file:
            context.load_cert_chain(conf.cert_file, keyfile=conf.key_file)
        if not conf.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if getattr(conf, "disable_strict_ssl_verification", False):
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return Http11Client(
        host,
        ssl_context=context,
        server_hostname=api.rest_client.server_hostname,
        max_connections=conf.connection_pool_maxsize or MAX_CONNECTIONS,
    )
