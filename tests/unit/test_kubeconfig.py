"""What a kubeconfig says about reaching a cluster (kinetic._core.kubeconfig), and the
exec credential protocol's rules (kinetic._core.exec_credential): pure, no loop."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kinetic import ConfigError
from kinetic._core import exec_credential, kubeconfig
from kinetic._core.exec_credential import ExecCredential
from kinetic._core.kubeconfig import ExecSpec, KubeTarget, Pem

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
V1 = "client.authentication.k8s.io/v1"


def config(
    *,
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
    current: str | None = "ctx",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://api.example:6443"}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t0k"}}],
        "contexts": [
            {"name": "ctx", "context": context or {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "ns2"}},
        ],
    }
    if current:
        doc["current-context"] = current
    return doc


# --------------------------------------------------------------------------- parsing


def test_yaml_and_json_parse_and_empty_is_an_empty_config() -> None:
    text = "clusters: []\ncurrent-context: a\n"
    assert kubeconfig.parse(text) == {"clusters": [], "current-context": "a"}
    assert kubeconfig.parse(json.dumps(config()).encode()) == config()
    assert kubeconfig.parse("") == {}


@pytest.mark.parametrize(("text", "match"), [("a: [", "not valid YAML"), ("- 1\n", "a list")])
def test_malformed_documents_are_config_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        kubeconfig.parse(text)


# --------------------------------------------------------------------------- contexts


def test_list_contexts_gives_names_in_order_and_the_current_one() -> None:
    assert kubeconfig.list_contexts(config()) == (["ctx", "other"], "ctx")
    assert kubeconfig.list_contexts(config(current=None)) == (["ctx", "other"], None)
    assert kubeconfig.list_contexts({}) == ([], None)
    assert kubeconfig.list_contexts({"contexts": None}) == ([], None)


def test_list_contexts_refuses_entries_without_names() -> None:
    with pytest.raises(ConfigError, match="without a name"):
        kubeconfig.list_contexts({"contexts": [{"context": {}}]})
    with pytest.raises(ConfigError, match="not a list"):
        kubeconfig.list_contexts({"contexts": {"a": 1}})


def test_the_current_context_is_the_default_and_a_named_one_wins() -> None:
    assert kubeconfig.resolve(config(), "/k").context == "ctx"
    other = kubeconfig.resolve(config(), "/k", "other")
    assert other.context == "other"
    assert other.namespace == "ns2"
    ref = kubeconfig.context_ref(config(), "other")
    assert (ref.cluster, ref.user, ref.namespace) == ("c", "u", "ns2")


def test_no_such_context_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match="no context 'nope' \\(it has: ctx, other\\)"):
        kubeconfig.resolve(config(), "/k", "nope")
    with pytest.raises(ConfigError, match="no current-context.*use-context"):
        kubeconfig.resolve(config(current=None), "/k")
    with pytest.raises(ConfigError, match="no context 'gone'"):
        kubeconfig.resolve(config(current="gone"), "/k")


def test_a_context_naming_a_missing_cluster_or_user_is_refused() -> None:
    with pytest.raises(ConfigError, match="names cluster 'x', which the kubeconfig does not"):
        kubeconfig.resolve(config(context={"cluster": "x", "user": "u"}), "/k")
    with pytest.raises(ConfigError, match="names user 'x', which the kubeconfig does not"):
        kubeconfig.resolve(config(context={"cluster": "c", "user": "x"}), "/k")
    with pytest.raises(ConfigError, match="names no cluster"):
        kubeconfig.resolve(config(context={"user": "u"}), "/k")


def test_a_context_without_a_user_is_anonymous() -> None:
    target = kubeconfig.resolve(config(context={"cluster": "c"}), "/k")
    assert (target.token, target.token_file, target.exec, target.client_cert) == (
        None,
        None,
        None,
        None,
    )


# --------------------------------------------------------------------------- clusters


def test_the_server_is_required_and_normalised() -> None:
    with pytest.raises(ConfigError, match="cluster 'c' has no server"):
        kubeconfig.resolve(config(cluster={"insecure-skip-tls-verify": True}), "/k")
    slash = kubeconfig.resolve(config(cluster={"server": "https://h:1/prefix/"}), "/k")
    assert slash.server == "https://h:1/prefix"
    bare = kubeconfig.resolve(config(cluster={"server": "10.0.0.1:6443"}), "/k")
    assert bare.server == "https://10.0.0.1:6443"


def test_ca_data_is_decoded_and_wins_over_the_file() -> None:
    data = base64.b64encode(CA).decode()
    both = {"server": "https://h", "certificate-authority-data": data, "certificate-authority": "x"}
    assert kubeconfig.resolve(config(cluster=both), "/k").ca == Pem(data=CA)


def test_ca_files_are_relative_to_the_kubeconfig_directory() -> None:
    rel = {"server": "https://h", "certificate-authority": "certs/../ca.pem"}
    assert kubeconfig.resolve(config(cluster=rel), "/home/me/.kube").ca == Pem(
        path="/home/me/.kube/ca.pem"
    )
    absolute = {"server": "https://h", "certificate-authority": "/etc/ca.pem"}
    assert kubeconfig.resolve(config(cluster=absolute), "/k").ca == Pem(path="/etc/ca.pem")


def test_malformed_base64_is_a_config_error() -> None:
    bad = {"server": "https://h", "certificate-authority-data": "not base64!"}
    with pytest.raises(ConfigError, match="certificate-authority-data is not valid base64"):
        kubeconfig.resolve(config(cluster=bad), "/k")
    user = {"client-certificate-data": "%%%", "client-key-data": "a2V5"}
    with pytest.raises(ConfigError, match="client-certificate-data is not valid base64"):
        kubeconfig.resolve(config(user=user), "/k")


def test_tls_options() -> None:
    cluster = {"server": "https://h", "insecure-skip-tls-verify": True, "tls-server-name": "api"}
    target = kubeconfig.resolve(config(cluster=cluster), "/k")
    assert target.insecure
    assert target.tls_server_name == "api"
    assert target.ca is None
    both = {**cluster, "certificate-authority": "ca.pem"}
    with pytest.raises(ConfigError, match="both a certificate authority and insecure"):
        kubeconfig.resolve(config(cluster=both), "/k")


def test_proxy_url_must_be_http() -> None:
    ok = {"server": "https://h", "proxy-url": "http://proxy:3128"}
    assert kubeconfig.resolve(config(cluster=ok), "/k").proxy_url == "http://proxy:3128"
    socks = {"server": "https://h", "proxy-url": "socks5://proxy:1080"}
    with pytest.raises(ConfigError, match="not an http\\(s\\) proxy"):
        kubeconfig.resolve(config(cluster=socks), "/k")


# --------------------------------------------------------------------------- users


def test_static_credentials() -> None:
    assert kubeconfig.resolve(config(user={"token": "abc"}), "/k").token == "abc"
    basic = kubeconfig.resolve(config(user={"username": "me", "password": "pw"}), "/k")
    assert (basic.username, basic.password) == ("me", "pw")
    with pytest.raises(ConfigError, match="both a token and a username/password"):
        kubeconfig.resolve(config(user={"token": "a", "username": "me"}), "/k")


def test_token_files_are_relative_to_the_kubeconfig_directory() -> None:
    target = kubeconfig.resolve(config(user={"tokenFile": "tok"}), "/home/me/.kube")
    assert target.token_file == "/home/me/.kube/tok"


def test_client_certificates_as_data_or_files() -> None:
    data = {
        "client-certificate-data": base64.b64encode(b"CERT").decode(),
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }
    target = kubeconfig.resolve(config(user=data), "/k")
    assert (target.client_cert, target.client_key) == (Pem(data=b"CERT"), Pem(data=b"KEY"))
    files = {"client-certificate": "c.pem", "client-key": "/abs/k.pem"}
    target = kubeconfig.resolve(config(user=files), "/d")
    assert (target.client_cert, target.client_key) == (
        Pem(path="/d/c.pem"),
        Pem(path="/abs/k.pem"),
    )
    with pytest.raises(ConfigError, match="certificate without its key"):
        kubeconfig.resolve(config(user={"client-certificate": "c.pem"}), "/d")


def test_secrets_stay_out_of_reprs() -> None:
    user = {"token": "s3cret", "client-key-data": base64.b64encode(b"PRIVATE").decode()}
    user["client-certificate-data"] = base64.b64encode(b"CERT").decode()
    text = repr(kubeconfig.resolve(config(user=user), "/k"))
    assert "s3cret" not in text
    assert "PRIVATE" not in text


def test_auth_provider_is_refused_with_the_gke_plugin_named() -> None:
    user = {"auth-provider": {"name": "gcp", "config": {}}}
    with pytest.raises(ConfigError) as info:
        kubeconfig.resolve(config(user=user), "/k")
    message = str(info.value)
    assert "auth-provider 'gcp'" in message
    assert "removed from the Kubernetes clients" in message
    assert "gke-gcloud-auth-plugin" in message
    assert "exec plugin" in message


def test_impersonation_is_refused() -> None:
    with pytest.raises(ConfigError, match="impersonation \\(as\\)"):
        kubeconfig.resolve(config(user={"token": "t", "as": "admin"}), "/k")


# --------------------------------------------------------------------------- exec


def exec_user(**fields: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": V1, "command": "plugin", **fields}}


def test_exec_specs_are_read_whole() -> None:
    user = exec_user(
        args=["--a", "b"],
        env=[{"name": "X", "value": "1"}, {"name": "Y", "value": ""}],
        provideClusterInfo=True,
        installHint="install it",
        interactiveMode="Never",
    )
    spec = kubeconfig.resolve(config(user=user), "/k").exec
    assert spec == ExecSpec(
        api_version=V1,
        command="plugin",
        args=("--a", "b"),
        env=(("X", "1"), ("Y", "")),
        provide_cluster_info=True,
        install_hint="install it",
    )


@pytest.mark.parametrize(
    ("command", "resolved"),
    [
        ("gke-gcloud-auth-plugin", "gke-gcloud-auth-plugin"),  # bare: looked up on PATH
        ("./bin/plugin", "/home/me/.kube/bin/plugin"),  # relative with a directory part
        ("bin/plugin", "/home/me/.kube/bin/plugin"),
        ("/usr/bin/plugin", "/usr/bin/plugin"),
    ],
)
def test_exec_commands_resolve_like_kubectl(command: str, resolved: str) -> None:
    user = {"exec": {"apiVersion": V1, "command": command}}
    spec = kubeconfig.resolve(config(user=user), "/home/me/.kube").exec
    assert spec is not None
    assert spec.command == resolved


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "apiVersion .* not supported"),
        ({"command": ""}, "exec has no command"),
        ({"args": "one"}, "args must be a list of strings"),
        ({"env": [{"name": "X", "value": 1}]}, "env entries need a name"),
        ({"env": {"X": "1"}}, "env must be a list"),
        ({"interactiveMode": "Always"}, "requires interactive mode"),
    ],
)
def test_malformed_exec_specs_are_config_errors(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        kubeconfig.resolve(config(user=exec_user(**fields)), "/k")


def test_v1beta1_is_accepted() -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "p"}}
    spec = kubeconfig.resolve(config(user=user), "/k").exec
    assert spec is not None
    assert spec.api_version.endswith("v1beta1")


# --------------------------------------------------------------------------- in-cluster


def test_in_cluster_targets_the_service_and_the_mounted_token() -> None:
    target = kubeconfig.in_cluster(
        {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    )
    assert target.server == "https://10.96.0.1:443"
    assert target.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert target.ca == Pem(path="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


def test_in_cluster_brackets_ipv6_hosts() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kubeconfig.in_cluster(env).server == "https://[fd00::1]:443"


def test_in_cluster_needs_both_variables() -> None:
    with pytest.raises(ConfigError, match="not inside a cluster"):
        kubeconfig.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


# --------------------------------------------------------------------------- exec protocol

SPEC = ExecSpec(api_version=V1, command="plugin", env=(("A", "spec"),), provide_cluster_info=True)


def credential_json(status: dict[str, Any], version: str = V1) -> str:
    return json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status})


def test_the_request_says_not_interactive_and_carries_the_cluster_when_asked() -> None:
    target = KubeTarget(server="https://h", insecure=True, tls_server_name="api")
    info = exec_credential.cluster_info(target, CA)
    request = json.loads(exec_credential.exec_info(SPEC, info))
    assert request["kind"] == "ExecCredential"
    assert request["apiVersion"] == V1
    assert request["spec"]["interactive"] is False
    cluster = request["spec"]["cluster"]
    assert cluster["server"] == "https://h"
    assert base64.b64decode(cluster["certificate-authority-data"]) == CA
    assert cluster["insecure-skip-tls-verify"] is True
    assert cluster["tls-server-name"] == "api"
    quiet = ExecSpec(api_version=V1, command="plugin")
    assert "cluster" not in json.loads(exec_credential.exec_info(quiet, info))["spec"]


def test_the_plugin_environment_layers_spec_env_and_exec_info() -> None:
    env = exec_credential.plugin_environment({"A": "base", "B": "base"}, SPEC, "{}")
    assert env == {"A": "spec", "B": "base", "KUBERNETES_EXEC_INFO": "{}"}


def test_credentials_parse_tokens_certificates_and_expiry() -> None:
    token = exec_credential.parse_credential(
        credential_json({"token": "tk", "expirationTimestamp": "2030-01-02T03:04:05Z"}), SPEC
    )
    assert token.token == "tk"
    assert token.expires_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    cert = exec_credential.parse_credential(
        credential_json({"clientCertificateData": "C", "clientKeyData": "K"}), SPEC
    )
    assert (cert.token, cert.client_cert, cert.client_key, cert.expires_at) == (
        None,
        b"C",
        b"K",
        None,
    )
    fractional = exec_credential.parse_credential(
        credential_json({"token": "t", "expirationTimestamp": "2030-01-02T03:04:05.123456789Z"}),
        SPEC,
    )
    assert fractional.expires_at is not None


@pytest.mark.parametrize(
    ("stdout", "match"),
    [
        ("not json", "printed no ExecCredential JSON"),
        (json.dumps({"kind": "Other"}), "other than an ExecCredential"),
        (credential_json({"token": "t"}, version="client.authentication.k8s.io/v1beta1"), "v1b"),
        (json.dumps({"apiVersion": V1, "kind": "ExecCredential"}), "without a status"),
        (credential_json({}), "neither a token nor a client certificate"),
        (credential_json({"clientCertificateData": "C"}), "without its key"),
        (credential_json({"token": "t", "expirationTimestamp": "soon"}), "not an RFC 3339"),
        (credential_json({"token": "t", "expirationTimestamp": "2030-01-02T03:04:05"}), "zone"),
    ],
)
def test_unusable_credentials_are_config_errors(stdout: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        exec_credential.parse_credential(stdout, SPEC)


def test_credentials_are_renewed_shortly_before_they_expire() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    hour = ExecCredential(token="t", expires_at=now + timedelta(hours=1))
    assert exec_credential.refresh_at(hour, now) == now + timedelta(minutes=59, seconds=30)
    short = ExecCredential(token="t", expires_at=now + timedelta(seconds=10))
    assert exec_credential.refresh_at(short, now) == now + timedelta(seconds=5)
    expired = ExecCredential(token="t", expires_at=now - timedelta(seconds=10))
    assert exec_credential.refresh_at(expired, now) == now - timedelta(seconds=10)
    assert exec_credential.refresh_at(ExecCredential(token="t"), now) is None


def test_failure_messages_name_command_status_stderr_and_hint() -> None:
    spec = ExecSpec(api_version=V1, command="/bin/plugin", install_hint="pip install plugin")
    stderr = b"\n".join(f"line {i}".encode() for i in range(10)) + b"\n\n"
    text = exec_credential.failure_message(spec, returncode=3, stderr=stderr)
    assert "'/bin/plugin' exited with status 3" in text
    assert "line 9" in text
    assert "line 5" in text
    assert "line 4" not in text  # only the last lines
    assert text.endswith("pip install plugin")
    missing = exec_credential.failure_message(spec, returncode=None, stderr="", reason="was lost")
    assert "'/bin/plugin' was lost" in missing


# --------------------------------------------------------------------------- merging


def test_config_paths_are_every_kubeconfig_entry_in_order() -> None:
    assert kubeconfig.config_paths({"KUBECONFIG": "/a::/b:"}, "/h") == ["/a", "/b"]
    assert kubeconfig.config_paths({"KUBECONFIG": ""}, "/h") == ["/h/.kube/config"]
    assert kubeconfig.config_paths({}, "/h") == ["/h/.kube/config"]


def test_merge_the_first_file_to_set_a_key_wins_and_is_never_changed() -> None:
    # Kubernetes' documented rules: the first current-context; of two entries of one
    # name, the first file's whole entry (the second's extra fields are discarded).
    first = {
        "current-context": "one",
        "users": [{"name": "red-user", "user": {"token": "first"}}],
        "contexts": [{"name": "one", "context": {"cluster": "shared", "user": "red-user"}}],
    }
    second = {
        "current-context": "two",
        "clusters": [{"name": "shared", "cluster": {"server": "https://second:6443"}}],
        "users": [
            {"name": "red-user", "user": {"token": "second", "username": "extra"}},
            {"name": "blue-user", "user": {"token": "blue"}},
        ],
        "contexts": [
            {"name": "one", "context": {"cluster": "elsewhere"}},
            {"name": "two", "context": {"cluster": "shared", "user": "blue-user"}},
        ],
    }
    merged = kubeconfig.merge([("/k/first", first), ("/k/second", second)])
    assert merged["current-context"] == "one"
    assert kubeconfig.list_contexts(merged) == (["one", "two"], "one")
    target = kubeconfig.resolve(merged, "/k")
    assert (target.server, target.token, target.username) == ("https://second:6443", "first", None)
    assert kubeconfig.resolve(merged, "/k", "two").token == "blue"
    # A file without current-context leaves it to the next one that sets it.
    merged = kubeconfig.merge([("/k/a", {"clusters": []}), ("/k/second", second)])
    assert merged["current-context"] == "two"


def test_merge_makes_each_files_relative_paths_absolute_against_that_file() -> None:
    cluster = {"server": "https://h:1", "certificate-authority": "ca.pem"}
    user = {
        "client-certificate": "certs/me.pem",
        "client-key": "/abs/me.key",
        "tokenFile": "../tok",
        "exec": {"apiVersion": V1, "command": "./bin/plugin", "args": ["a"]},
    }
    bare = {"exec": {"apiVersion": V1, "command": "gke-gcloud-auth-plugin"}}
    first = {"contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}
    second = {
        "current-context": "x",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}, {"name": "bare", "user": bare}],
    }
    merged = kubeconfig.merge([("/home/me/.kube/config", first), ("/etc/kube/extra", second)])
    resolved = merged["users"][0]["user"]
    assert merged["clusters"][0]["cluster"]["certificate-authority"] == "/etc/kube/ca.pem"
    assert resolved["client-certificate"] == "/etc/kube/certs/me.pem"
    assert resolved["client-key"] == "/abs/me.key"
    assert resolved["tokenFile"] == "/etc/tok"
    assert resolved["exec"] == {"apiVersion": V1, "command": "/etc/kube/bin/plugin", "args": ["a"]}
    assert merged["users"][1]["user"] == bare  # a bare command is looked up on PATH
    assert user["tokenFile"] == "../tok"  # the parsed documents are not changed
    # Resolved against any directory, the paths stay the second file's.
    assert kubeconfig.resolve(merged, "/elsewhere").ca == Pem(path="/etc/kube/ca.pem")


def test_merge_names_the_file_of_a_malformed_section() -> None:
    with pytest.raises(ConfigError, match="/k/bad: .*'users' is not a list"):
        kubeconfig.merge([("/k/good", config()), ("/k/bad", {"users": {"u": {}}})])
