"""``s3://`` read natively (``lerobot_nodes.sources.s3``): SigV4 signatures as botocore makes them, a
moto server that verifies them, paged listings, addressing and credentials, and which roots go to s3fs.

The epoch-level checks (samples equal the map-style reader's with 0 and 2 workers, identities shared
with s3fs, indexes cached) are in ``test_fsspec_remote.py``, run on both S3 paths.
"""

from __future__ import annotations

import pickle
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import ConfigError, SourceAuthError, SourceFileNotFoundError
from lerobot_nodes.sources import FsspecSource, open_source
from lerobot_nodes.sources import s3 as s3_module
from lerobot_nodes.sources.s3 import S3Address, S3Auth, S3Source, bucket_region_answered, reads_natively
from lerobot_nodes.sources.s3_signing import EMPTY_BODY_SHA256, S3Keys, amz_date, signed_headers
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.s3 import CREDENTIALS, LoopbackS3

botocore_auth = pytest.importorskip("botocore.auth")
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import ReadOnlyCredentials  # noqa: E402

ROOT = "s3://robots/datasets/small"


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("s3native") / "dataset", episode_lengths=[9, 12], seed=8)


@pytest.fixture(scope="module")
def server(local_dataset):
    with LoopbackS3() as server:
        server.upload(local_dataset, ROOT)
        yield server


@pytest.fixture
def s3_env(server, monkeypatch, tmp_path):
    """This process pointed at the server, with the environment's keys and no AWS config files."""
    for key, value in server.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    return server


def botocore_signature(method: str, url: str, keys: S3Keys, region: str, when: float) -> str:
    """The signature botocore's ``S3SigV4Auth`` gives the same request at the same time."""
    auth = botocore_auth.S3SigV4Auth(ReadOnlyCredentials(keys.access_key, keys.secret_key, keys.session_token), "s3", region)
    request = AWSRequest(method, url, headers={"X-Amz-Date": amz_date(when), "X-Amz-Content-SHA256": EMPTY_BODY_SHA256})
    if keys.session_token:
        request.headers["X-Amz-Security-Token"] = keys.session_token
    request.context["timestamp"] = amz_date(when)
    canonical = auth.canonical_request(request)
    return str(auth.signature(auth.string_to_sign(request, canonical), request))


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@given(
    host=st.sampled_from(["http://127.0.0.1:9000", "https://robots.s3.eu-west-3.amazonaws.com", "http://minio:80"]),
    key=st.lists(text, min_size=1, max_size=3),
    query=st.dictionaries(st.sampled_from(["list-type", "prefix", "continuation-token", "max-keys"]), text, max_size=4),
    secret=text,
    token=st.none() | text,
    region=st.sampled_from(["us-east-1", "eu-west-3", "auto"]),
    when=st.integers(0, 4_000_000_000),
)
def test_signatures_are_botocores_for_any_key_query_and_credentials(host, key, query, secret, token, region, when):
    from urllib.parse import urlencode

    url = f"{host}/robots/" + quote("/".join(key), safe="/~")
    if query:
        url += "?" + urlencode(query, quote_via=quote, safe="-_.~")
    keys = S3Keys("AKIDEXAMPLE", secret, token)
    headers = signed_headers("GET", url, keys, region, when)
    assert headers["Authorization"].endswith("Signature=" + botocore_signature("GET", url, keys, region, when))
    assert headers["X-Amz-Date"] == amz_date(when)
    assert ("X-Amz-Security-Token" in headers) == bool(token)


def test_a_server_that_verifies_signatures_accepts_them_and_refuses_a_wrong_secret(s3_env):
    """moto checks every request's signature and the user's permissions once its auth is on."""
    import boto3
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin

    iam = boto3.client("iam", endpoint_url=s3_env.endpoint, region_name="us-east-1")
    iam.create_user(UserName="robot")
    iam.put_user_policy(
        UserName="robot", PolicyName="read",
        PolicyDocument='{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}',
    )  # fmt: skip
    created = iam.create_access_key(UserName="robot")["AccessKey"]
    good = {"key": created["AccessKeyId"], "secret": created["SecretAccessKey"]}
    previous = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        source = open_source(ROOT, storage_options=good)
        assert isinstance(source, S3Source)
        video = source.list_files("videos/")[0]
        assert len(source.read_ranges(video.path, [(0, 64), (video.size - 8, video.size)])[1]) == 8
        copy = pickle.loads(pickle.dumps(source))  # a worker's copy signs with the same explicit keys
        assert copy.read_file("meta/info.json") == source.read_file("meta/info.json")
        with pytest.raises(SourceAuthError, match=r"s3://robots/datasets/small: access denied \(HTTP 403") as raised:
            open_source(ROOT, storage_options={**good, "secret": good["secret"] + "x"})
        assert "\n" not in str(raised.value) and good["secret"] not in str(raised.value)
        listed = open_source(ROOT, storage_options=good)  # then the keys stop being good: a read says so
        listed.credentials.explicit = S3Keys(good["key"], good["secret"] + "x")
        with pytest.raises(SourceAuthError, match=f"{video.path}") as refused:
            listed.read_ranges(video.path, [(0, 64)])
        assert "\n" not in str(refused.value)
    finally:
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = previous


def test_a_listing_of_many_pages_is_every_object_once(s3_env, monkeypatch, local_dataset):
    monkeypatch.setattr(s3_module, "LIST_PAGE", 3)
    source = open_source(ROOT)
    expected = sorted(p.relative_to(local_dataset).as_posix() for p in local_dataset.rglob("*") if p.is_file())
    assert [info.path for info in source.list_files()] == expected
    assert source.http_stats.api_requests == -(-len(expected) // 3)
    for info in source.list_files():
        assert info.size == (local_dataset / info.path).stat().st_size and info.fingerprint.startswith("ETag:")


def test_the_environments_keys_sign_and_no_keys_sends_unsigned_requests(s3_env, monkeypatch):
    source = open_source(ROOT)
    assert isinstance(source, S3Source) and source.credentials.keys() == S3Keys(
        CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    )
    assert "Authorization" in source.credentials("http://127.0.0.1/robots/x")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    unsigned = open_source(ROOT)  # botocore's chain finds nothing: a public bucket's requests
    assert unsigned.credentials.keys() is None and unsigned.credentials("http://127.0.0.1/robots/x") == {}
    assert open_source(ROOT, storage_options={"anon": True}).credentials("http://127.0.0.1/robots/x") == {}
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "temporary")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    headers = open_source(ROOT).credentials("http://127.0.0.1/robots/x")
    assert headers["X-Amz-Security-Token"] == "session-token"


def test_a_profile_is_read_by_botocore(s3_env, monkeypatch, tmp_path):
    (tmp_path / "credentials").write_text("[robot-lab]\naws_access_key_id = PROFILEKEY\naws_secret_access_key = s\n")
    (tmp_path / "config").write_text("[profile robot-lab]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    auth = S3Auth.of({"profile": "robot-lab"}, "eu-west-3")
    assert auth.keys() == S3Keys("PROFILEKEY", "s")
    copy = pickle.loads(pickle.dumps(auth))
    assert copy.keys() == S3Keys("PROFILEKEY", "s") and b"PROFILEKEY" not in pickle.dumps(auth)
    with pytest.raises(SourceAuthError, match="AWS credentials could not be resolved: ProfileNotFound"):
        S3Auth.of({"profile": "nobody"}, "us-east-1").keys()
    assert s3_module._profile_region("robot-lab") == "eu-west-3"


def test_addresses_follow_the_endpoint_region_and_bucket_rules():
    aws = S3Address.of("s3://robots/data/set", {}, {"AWS_REGION": "eu-west-3"})
    assert aws.object_url("data/set/a b.mp4") == "https://robots.s3.eu-west-3.amazonaws.com/data/set/a%20b.mp4"
    dotted = S3Address.of("s3://my.robots/x", {}, {})
    assert dotted.signing_region == "us-east-1"
    assert dotted.bucket_url() == "https://s3.us-east-1.amazonaws.com/my.robots/"  # TLS names no dotted bucket
    environ = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://b:2/"}
    assert S3Address.of("s3://robots", {}, environ).bucket_url() == "http://b:2/robots/"
    assert S3Address.of("s3://robots", {"endpoint_url": "http://c:3"}, environ).endpoint == "http://c:3"
    client = {"client_kwargs": {"endpoint_url": "http://d:4", "region_name": "auto"}}
    assert S3Address.of("s3://robots/p/", client, environ) == S3Address("robots", "p", "auto", "http://d:4")
    with pytest.raises(ConfigError, match="expected s3://BUCKET"):
        S3Address.of("s3://", {}, {})


def test_s3fs_options_send_the_root_to_fsspec_and_half_keys_are_refused(s3_env):
    assert reads_natively(None) and reads_natively({"anon": True, "client_kwargs": {"region_name": "x"}})
    assert not reads_natively({"requester_pays": True})
    assert not reads_natively({"client_kwargs": {"verify": False}})
    assert isinstance(open_source(ROOT, storage_options={"requester_pays": False}), FsspecSource)
    with pytest.raises(ConfigError, match="both 'key' and 'secret'"):
        open_source(ROOT, storage_options={"key": "only-the-key"})
    with pytest.raises(ConfigError, match="s3fs's"):
        S3Source(ROOT, {"requester_pays": False})


def test_a_missing_bucket_or_prefix_is_one_clear_line(s3_env):
    with pytest.raises(SourceFileNotFoundError, match=r"^s3://robots/nothing holds no files"):
        open_source("s3://robots/nothing")
    with pytest.raises(SourceFileNotFoundError, match=r"^s3://no-such-bucket: no such bucket") as raised:
        open_source("s3://no-such-bucket")
    assert "\n" not in str(raised.value)


def test_a_bucket_in_another_aws_region_is_found_from_the_answer():
    """AWS's answers to a request sent to the wrong regional endpoint (as its documentation gives them)."""
    moved = b"<Error><Code>PermanentRedirect</Code><Message>...</Message><Endpoint>robots.s3.eu-west-3.amazonaws.com</Endpoint></Error>"
    assert bucket_region_answered(301, {"x-amz-bucket-region": "eu-west-3"}, moved) == "eu-west-3"
    malformed = (
        b"<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' is wrong; expecting "
        b"'ap-south-1'</Message><Region>ap-south-1</Region></Error>"
    )
    assert bucket_region_answered(400, {}, malformed) == "ap-south-1"
    assert bucket_region_answered(403, {"x-amz-bucket-region": "eu-west-3"}, b"<Error/>") is None
    assert bucket_region_answered(400, {}, b"not xml") is None
