"""The policy's parsing and its two checks (by name before resolution, by address after)."""

import ipaddress

import pytest

from sandbox.egress.policy import Refused, parse_policy
from sandbox.common.errors import ApiError


def test_names_ports_and_wildcards():
    policy = parse_policy({"allow": ["API.Example.org.", "*.example.net", "example.com:8443", "10.0.0.0/8"]})
    policy.check_name("api.example.org", 443)
    policy.check_name("a.b.example.net", 80)
    policy.check_name("example.com", 8443)
    policy.check_name("10.1.2.3", 443)
    for host, port in (("example.net", 443), ("api.example.org", 22), ("example.com", 443), ("evil.org", 443),
                       ("93.184.216.34", 443), ("xexample.net", 443)):
        with pytest.raises(Refused):
            policy.check_name(host, port)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                                     "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "0.0.0.0", "100.64.0.1",
                                     "224.0.0.1"])
def test_non_public_addresses_are_refused_unless_listed(address):
    with pytest.raises(Refused):
        parse_policy({"allow": ["a.example"]}).check_address("a.example", ipaddress.ip_address(address), 443)
    listed = parse_policy({"allow": ["a.example", f"{address}"]})
    listed.check_address("a.example", ipaddress.ip_address(address), 443)


def test_public_address_passes():
    parse_policy({"allow": ["a.example"]}).check_address("a.example", ipaddress.ip_address("151.101.0.223"), 443)


@pytest.mark.parametrize("egress", [[], {"allow": "x"}, {"allow": ["bad host"]}, {"allow": ["a.example:99999"]},
                                    {"allow": [3]}, {"pip": "yes"}, {"max_bytes": 0}, {"other": 1},
                                    {"secrets": [1]}, {"allow": ["*"]}])
def test_bad_policies_are_a_422(egress):
    with pytest.raises(ApiError) as info:
        parse_policy(egress)
    assert info.value.status == 422 and "egress" in info.value.message


def test_pip_adds_the_index_hosts_on_443():
    policy = parse_policy({"pip": True}, pip_hosts=("pypi.org", "files.pythonhosted.org"))
    policy.check_name("files.pythonhosted.org", 443)
    policy.check_address("pypi.org", ipaddress.ip_address("203.0.113.80"), 443)  # the operator's index, where it is
    with pytest.raises(Refused):
        policy.check_address("other.example", ipaddress.ip_address("203.0.113.80"), 443)
    with pytest.raises(Refused):
        parse_policy({"allow": ["pypi.org"]}).check_address("pypi.org", ipaddress.ip_address("203.0.113.80"), 443)
    with pytest.raises(Refused):
        parse_policy({"pip": False}, pip_hosts=("pypi.org",)).check_name("pypi.org", 443)


def test_secrets_are_capped_per_owner_with_the_caps_in_the_error():
    from sandbox.egress.secrets import SecretLimits, SecretStore

    store = SecretStore(SecretLimits(per_owner=3, value_bytes=100, hosts_per_secret=2))
    for i in range(3):
        store.put(f"S{i}", "v", ["a.example"], owner=1001)
    store.put("S0", "replaced", ["a.example"], owner=1001)  # replacing one is not one more
    store.put("S0", "x", ["a.example"], owner=1002)  # another owner has a cap of their own
    refusals = []
    for args in (("S3", "v", ["a.example"]), ("S0", "v" * 101, ["a.example"]), ("S0", "v", ["a.x", "b.x", "c.x"])):
        with pytest.raises(ApiError) as caught:
            store.put(*args, owner=1001)
        refusals.append((caught.value.status, caught.value.code, caught.value.body()["error"]["limits"]))
    caps = {"max_secrets": 3, "max_value_bytes": 100, "max_hosts_per_secret": 2}
    assert refusals == [(409, "limit_exceeded", caps), (422, "limit_exceeded", caps), (422, "limit_exceeded", caps)]
    assert store.count(1001) == 3 and store.find("S0", 1001).value == "replaced"
