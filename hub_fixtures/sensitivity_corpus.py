"""Two corpora for the sensitive tier: leaks as agents write them, and near misses.

LEAKS: token shapes from the public secret-scanning rule sets (gitleaks' default rules,
detect-secrets' plugins, GitHub's secret-scanning patterns) and the ways agents paste secrets
(shell, .env, YAML, JSON, URLs, command lines, prose). NEAR_MISSES: code that reads a secret from
the environment, error messages, docs that name a variable, talk about passwords.

Every value is fake, made here at run time from a seeded generator, and every token prefix is
joined from pieces, so no token-shaped literal is in the source (nothing for push protection to
find, nothing that was ever a credential).
"""

from __future__ import annotations

import random
import string

_rng = random.Random(20261204)
ALNUM = string.ascii_letters + string.digits
LOWER_NUM = string.ascii_lowercase + string.digits
UPPER_NUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"


def fake(alphabet: str, n: int) -> str:
    """`n` random characters of `alphabet` (seeded: the corpus is the same on every run)."""
    return "".join(_rng.choice(alphabet) for _ in range(n))


def j(*parts: str) -> str:
    """Join pieces: how each token prefix is written in this file."""
    return "".join(parts)


AWS_ID = j("AK", "IA") + fake(UPPER_NUM, 16)
AWS_SECRET = fake(B64, 40)
GH = j("gh", "p_") + fake(ALNUM, 36)
GHO = j("gh", "o_") + fake(ALNUM, 36)
GHS = j("gh", "s_") + fake(ALNUM, 36)
GH_PAT = j("github", "_pat_") + fake(ALNUM, 22) + "_" + fake(ALNUM, 59)
GLPAT = j("glp", "at-") + fake(URLSAFE, 20)
NPM = j("np", "m_") + fake(ALNUM, 36)
HF = j("h", "f_") + fake(string.ascii_letters, 34)
SLACK_BOT = j("xo", "xb-") + fake(string.digits, 12) + "-" + fake(string.digits, 13) + "-" + fake(ALNUM, 24)
SLACK_HOOK = (
    j("https://hooks.", "slack.com/services/")
    + "T"
    + fake(UPPER_NUM, 8)
    + "/B"
    + fake(UPPER_NUM, 10)
    + "/"
    + fake(ALNUM, 24)
)
AZURE_KEY = fake(B64, 86) + "=="
OPENAI = j("s", "k-proj-") + fake(URLSAFE, 48)
ANTHROPIC = j("s", "k-ant-", "api03-") + fake(URLSAFE, 93) + "AA"
STRIPE = j("s", "k_", "live_") + fake(ALNUM, 24)
GOOGLE = j("AI", "za") + fake(URLSAFE, 35)
GOOGLE_OAUTH = j("GOC", "SPX-") + fake(URLSAFE, 28)
SENDGRID = j("S", "G.") + fake(URLSAFE, 22) + "." + fake(URLSAFE, 43)
TWILIO = j("S", "K") + fake(HEX, 32)
MAILGUN = j("ke", "y-") + fake(LOWER_NUM, 32)
MAILCHIMP = fake(HEX, 32) + "-us" + str(_rng.randint(1, 20))
SHOPIFY = j("shp", "at_") + fake(HEX, 32)
PYPI = j("pypi-", "AgEIcHlwaS5vcmc") + fake(URLSAFE, 70)
DO = j("do", "p_v1_") + fake(HEX, 64)
DATABRICKS = j("da", "pi") + fake(HEX, 32)
TELEGRAM = fake(string.digits, 10) + ":" + j("A", "A") + fake(URLSAFE, 33)
DISCORD_HOOK = j("https://discord.com/api/", "webhooks/") + fake(string.digits, 18) + "/" + fake(URLSAFE, 68)
VAULT = j("hv", "s.") + fake(URLSAFE, 90)
POSTMAN = j("PM", "AK-") + fake(HEX, 24) + "-" + fake(HEX, 34)
AGE = j("AGE-SECRET", "-KEY-1") + fake(UPPER_NUM, 58)
LINEAR = j("lin", "_api_") + fake(ALNUM, 40)
JWT = j("ey", "J") + fake(URLSAFE, 30) + "." + j("ey", "J") + fake(URLSAFE, 60) + "." + fake(URLSAFE, 43)
SB_TOKEN = j("sb", "s_") + fake(URLSAFE, 43)
PEM_RSA = (
    j("-----BEGIN RSA ", "PRIVATE KEY-----\n")
    + fake(B64, 64)
    + "\n"
    + fake(B64, 64)
    + j("\n-----END RSA ", "PRIVATE KEY-----")
)
PEM_OPENSSH = j("-----BEGIN OPENSSH ", "PRIVATE KEY-----\n") + fake(B64, 70) + "\n"
PEM_PKCS8 = j("-----BEGIN ", "PRIVATE KEY-----\n") + fake(B64, 64)
PEM_PGP = j("-----BEGIN PGP ", "PRIVATE KEY BLOCK-----\n\n") + fake(B64, 64)
PW = fake(ALNUM, 14) + "!"
SHORT_PW = fake(string.ascii_lowercase, 6) + fake(string.digits, 2)
HIGH_ENTROPY = fake(ALNUM, 40)
HEX_SECRET = fake(HEX, 64)
DJANGO_KEY = "django-insecure-" + fake(LOWER_NUM + "!@#%^&*(-_=+)", 50).replace("(", "x").replace(")", "y")

# (what it is, the text an agent sends)
LEAKS: list[tuple[str, str]] = [
    # --- environment-style names, shell and .env -------------------------------------------------
    ("export aws secret", f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}"),
    (
        "aws credentials file",
        f"[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n",
    ),
    ("aws id alone", f"the key id is {AWS_ID}, region us-east-1"),
    ("DATABASE_PASSWORD", f"DATABASE_PASSWORD={PW}"),
    ("DB_PASS", f"DB_PASS={SHORT_PW}"),
    ("POSTGRES_PASSWORD yaml", f"environment:\n  POSTGRES_PASSWORD: {PW}\n  POSTGRES_DB: app"),
    ("PGPASSWORD inline", f"PGPASSWORD={SHORT_PW} psql -h db -U app -c 'select 1'"),
    ("MYSQL_ROOT_PASSWORD", f"docker run -e MYSQL_ROOT_PASSWORD={PW} mysql:8"),
    ("SECRET_KEY", f"SECRET_KEY={HIGH_ENTROPY}"),
    ("DJANGO_SECRET_KEY", f"export DJANGO_SECRET_KEY='{DJANGO_KEY}'"),
    ("JWT_SECRET", f"JWT_SECRET={fake(ALNUM, 32)}"),
    ("STRIPE_API_KEY", f"STRIPE_API_KEY={STRIPE}"),
    ("bare TOKEN", f"TOKEN={fake(ALNUM, 32)}"),
    ("GITHUB_TOKEN export", f"export GITHUB_TOKEN={GH}"),
    ("OPENAI_API_KEY", f"OPENAI_API_KEY={OPENAI}"),
    ("ANTHROPIC_API_KEY", f'ANTHROPIC_API_KEY="{ANTHROPIC}"'),
    ("REDIS_PASSWORD", f"REDIS_PASSWORD={SHORT_PW}"),
    ("api key lower", f"api_key = '{fake(ALNUM, 32)}'"),
    ("client secret", f'client_secret = "{fake(URLSAFE, 30)}"'),
    ("access token", f"access_token: {fake(ALNUM, 40)}"),
    (
        ".env file",
        f"DEBUG=false\nDATABASE_URL=postgres://app:{SHORT_PW}@db:5432/app\nSENTRY_DSN=\nSMTP_PASSWORD={PW}\n",
    ),
    (".env file 2", f"APP_ENV=production\nMAIL_PASSWORD={SHORT_PW}\n"),
    ("high entropy env", f"export PAYMENTS_SIGNING={HIGH_ENTROPY}"),
    ("hex signing secret", f"WEBHOOK_SECRET={HEX_SECRET}"),
    ("encryption key", f"ENCRYPTION_KEY={fake(B64, 44)}"),
    (
        "passphrase",
        f'passphrase: "{fake(string.ascii_lowercase, 8)} {fake(string.ascii_lowercase, 7)} {fake(string.ascii_lowercase, 9)}"',
    ),
    ("go assignment", f'dbPassword := "{SHORT_PW}"'),
    ("ruby hash", f"{{ password => '{SHORT_PW}' }}"),
    ("js object", f"const config = {{ user: 'app', password: '{SHORT_PW}' }};"),
    ("python kwargs", f"psycopg.connect(host='db', user='app', password='{SHORT_PW}')"),
    ("pwd", f"pwd={SHORT_PW}"),
    ("npmrc", f"//registry.npmjs.org/:_authToken={NPM}"),
    ("yaml credentials", f"credentials:\n  username: deploy\n  password: {PW}\n"),
    ("k8s secret data", f"data:\n  password: {fake(B64, 24)}=\n"),
    # --- JSON and frames ---------------------------------------------------------------------------
    ("json password", f'{{"password": "{SHORT_PW}"}}'),
    ("json nested", f'{{"db": {{"host": "db", "user": "app", "password": "{PW}"}}}}'),
    ("json api key", f'{{"apiKey": "{fake(ALNUM, 32)}", "region": "eu"}}'),
    (
        "json service account",
        '{"type": "service_account", "private_key": "' + PEM_PKCS8.replace("\n", "\\n") + '"}',
    ),
    ("frame with token", f'{{"type": "task_completed", "result": "deployed with {GH}"}}'),
    # --- URLs and commands --------------------------------------------------------------------------
    ("redis url no user", f"REDIS_URL=redis://:{SHORT_PW}@cache:6379/0"),
    ("postgres url", f"postgresql://admin:{PW}@db.internal:5432/prod"),
    ("https basic url", f"git clone https://deploy:{fake(ALNUM, 20)}@git.example.org/team/repo.git"),
    ("x-access-token url", f"https://x-access-token:{GHS}@github.com/org/repo.git"),
    ("curl -u", f"curl -u admin:{SHORT_PW} https://api.internal/health"),
    ("curl --user", f"curl -s --user 'ci:{PW}' -X POST https://jenkins/build"),
    ("curl auth token header", f"curl -H 'Authorization: token {GH}' https://api.github.com/user"),
    ("bearer header", f'curl -H "Authorization: Bearer {fake(URLSAFE, 40)}" https://api'),
    ("basic header", f"Authorization: Basic {fake(B64, 28)}="),
    ("x-api-key header", f"-H 'X-API-Key: {fake(ALNUM, 32)}'"),
    ("docker login -p", f"docker login -u deploy -p {PW} registry.example.org"),
    ("docker login --password", f"docker login registry.gitlab.com --username ci --password={GLPAT}"),
    ("mysql -p", f"mysql -u root -p{SHORT_PW} -h 127.0.0.1 app"),
    ("mysqldump --password", f"mysqldump --user=root --password={PW} app > dump.sql"),
    ("sshpass", f"sshpass -p '{PW}' ssh deploy@10.0.0.5"),
    ("redis-cli -a", f"redis-cli -h cache -a {PW} ping"),
    # --- tokens of other services -------------------------------------------------------------------
    ("npm token", f"use {NPM} to publish"),
    ("hugging face token", f"huggingface-cli login --token {HF}"),
    ("gitlab pat", f"here is my gitlab token {GLPAT}"),
    ("slack webhook", f"post to {SLACK_HOOK} when done"),
    ("slack bot token", f"SLACK_BOT={SLACK_BOT}"),
    (
        "azure account key",
        f"DefaultEndpointsProtocol=https;AccountName=store1;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
    ),
    ("github oauth token", f"gh auth token printed {GHO}"),
    ("github app token", f"installation token: {GHS}"),
    ("github fine-grained pat", f"my pat is {GH_PAT}"),
    ("openai key", f"try {OPENAI}"),
    ("anthropic key", f"the key {ANTHROPIC}"),
    ("stripe", f"charge with {STRIPE}"),
    ("google api key", f"maps key {GOOGLE}"),
    ("google oauth secret", f"client secret {GOOGLE_OAUTH}"),
    ("sendgrid", f"mail via {SENDGRID}"),
    ("twilio", f"twilio key {TWILIO}"),
    ("mailgun", f"mailgun {MAILGUN}"),
    ("mailchimp", f"mailchimp {MAILCHIMP}"),
    ("shopify", f"shopify admin {SHOPIFY}"),
    ("pypi", f"TWINE_PASSWORD={PYPI}"),
    ("pypi alone", f"token {PYPI}"),
    ("digitalocean", f"doctl auth init -t {DO}"),
    ("databricks", f"databricks token {DATABRICKS}"),
    ("telegram", f"bot token {TELEGRAM}"),
    ("discord webhook", f"webhook {DISCORD_HOOK}"),
    ("vault", f"VAULT_TOKEN={VAULT}"),
    ("vault alone", f"vault login {VAULT}"),
    ("postman", f"postman {POSTMAN}"),
    ("age", f"age key {AGE}"),
    ("linear", f"linear {LINEAR}"),
    (
        "gitlab runner token",
        f"gitlab-runner register --registration-token {j('GR13', '48941')}{fake(URLSAFE, 20)}",
    ),
    (
        "azure sas url",
        f"https://store1.blob.core.windows.net/logs/app.log?sv=2022-11-02&se=2026-12-31&sr=b&sp=r&{j('si', 'g=')}{fake(ALNUM, 43)}%3D",
    ),
    ("square token", f"square {j('sq0', 'atp-')}{fake(URLSAFE, 22)}"),
    (
        "discord bot token",
        f"discord bot token {j('M', fake(ALNUM, 23))}.{fake(URLSAFE, 6)}.{fake(URLSAFE, 27)}",
    ),
    ("jwt", f"session cookie {JWT}"),
    ("switchboard token", f"my token is {SB_TOKEN}"),
    # --- keys ---------------------------------------------------------------------------------------
    ("rsa key", f"here is the deploy key:\n{PEM_RSA}"),
    ("openssh key", PEM_OPENSSH),
    ("pkcs8 key", PEM_PKCS8),
    ("pgp key", PEM_PGP),
    # --- plain language -----------------------------------------------------------------------------
    ("my password is", "my password is correcthorsebatterystaple"),
    ("password is with digits", f"the admin password is {SHORT_PW}"),
    ("password for host is", f"the password for staging is {PW}"),
    ("token is", f"the API token is {fake(ALNUM, 24)}"),
    ("pw colon", f"login: deploy, pw: {SHORT_PW}"),
    ("password colon prose", f"password: {PW}"),
]

NEAR_MISSES: list[tuple[str, str]] = [
    # --- code that reads a secret -------------------------------------------------------------------
    ("os.environ", 'password = os.environ["DB_PASSWORD"]'),
    ("os.getenv", 'api_key = os.getenv("API_KEY")'),
    ("getenv default", 'token = os.getenv("TOKEN", "")'),
    ("settings ref", "SECRET_KEY = settings.SECRET_KEY"),
    ("env call", "SECRET_KEY = env('DJANGO_SECRET_KEY')"),
    ("process.env", "const token = process.env.GITHUB_TOKEN;"),
    ("process.env apikey", "apiKey: process.env.OPENAI_API_KEY,"),
    ("shell var", 'export PGPASSWORD="$DB_PASSWORD"'),
    ("shell braces", "PASSWORD=${POSTGRES_PASSWORD}"),
    ("gha secrets", "GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}"),
    ("compose var", "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it}"),
    ("curl var", 'curl -u "$USER:$TOKEN" https://api.internal'),
    ("docker stdin", 'echo "$CR_PAT" | docker login ghcr.io -u bot --password-stdin'),
    ("mysql prompt", "mysql -u root -p app"),
    ("function arg", "def connect(user: str, password: str) -> Connection:"),
    ("type hints", "class Settings(BaseModel):\n    api_key: str\n    token: SecretStr\n"),
    ("ts type", "interface Auth { token: string; password?: string }"),
    ("assign from var", "password = new_password"),
    ("camel var", "this.token = accessToken;"),
    ("compare", "if password == confirm_password:"),
    ("vault read", "DB_PASS=$(vault kv get -field=password secret/db)"),
    ("keyring", 'password = keyring.get_password("app", user)'),
    ("request field", "password = request.POST['password']"),
    ("max tokens", "max_tokens = 4096"),
    ("token count", "token_count=512"),
    ("tokenizer", "tokenizer=bert-base-uncased"),
    ("password min length", "PASSWORD_MIN_LENGTH=12"),
    ("auth header from var", 'headers = {"Authorization": f"Bearer {token}"}'),
    ("auth header var shell", 'curl -H "Authorization: Bearer $TOKEN" https://api'),
    ("secret name k8s", "secretName: db-credentials"),
    ("secret key ref", "valueFrom:\n  secretKeyRef:\n    name: app\n    key: password"),
    ("bypass flag", "bypass=1"),
    ("passenger", "passengers=4"),
    ("url without password", "postgres://app@db:5432/app"),
    ("url placeholder", "postgres://USER:PASSWORD@HOST:5432/DB"),
    ("url with var", "https://oauth2:${GITLAB_TOKEN}@gitlab.com/group/repo.git"),
    ("localhost url", "open http://localhost:8000/holds/ and http://[::1]:8000/"),
    ("git ssh url", "git@github.com:org/repo.git"),
    # --- error messages -----------------------------------------------------------------------------
    ("pg auth failed", 'psql: error: FATAL:  password authentication failed for user "postgres"'),
    ("password reset", "password: reset link sent"),
    ("invalid token", "Error: invalid token: expired"),
    ("token null", "token: null"),
    ("key error", "KeyError: 'SECRET_KEY'"),
    ("django improperly", "ImproperlyConfigured: The SECRET_KEY setting must not be empty."),
    ("401", "HTTP 401 Unauthorized: Bad credentials (check your token)"),
    (
        "github push protection",
        "remote: error: GH013: Repository rule violations found: push cannot contain secrets",
    ),
    ("npm e401", 'npm ERR! code E401 Unable to authenticate, need: Basic realm="GitHub Package Registry"'),
    (
        "aws error",
        "An error occurred (InvalidClientTokenId) when calling the GetCallerIdentity operation: The security token included in the request is invalid.",
    ),
    ("ssh error", "Permission denied (publickey,password)."),
    ("stripe error", "No API key provided. Set your API key using stripe.api_key = <API-KEY>."),
    # --- docs that name a variable ------------------------------------------------------------------
    ("doc env table", "| `DB_PASSWORD` | required | the database password |"),
    ("doc set var", "Set the DB_PASSWORD environment variable before starting the server."),
    ("doc export placeholder", "export OPENAI_API_KEY=<your-api-key>"),
    ("doc example", "API_KEY=your_api_key_here"),
    ("doc stars", "password: ********"),
    ("doc x", "SECRET_KEY=xxxxxxxxxxxxxxxx"),
    ("doc changeme", "POSTGRES_PASSWORD=changeme"),
    ("doc example key", "AWS_SECRET_ACCESS_KEY=YOUR_SECRET_ACCESS_KEY"),
    (
        "doc readme",
        "Tokens start with `ghp_` for classic personal access tokens and `github_pat_` for fine-grained ones.",
    ),
    ("doc pem mention", "Paste the public key (-----BEGIN PUBLIC KEY-----) into the form."),
    ("doc prefix", "Stripe keys look like sk_live_... and sk_test_...; never commit them."),
    ("doc authorization", "Send an Authorization: Bearer <token> header with every request."),
    ("doc auth var", "Authorization: token YOUR_TOKEN_HERE"),
    ("doc password flag", "Use `--password-stdin` instead of `-p` with docker login."),
    ("doc sshpass", "sshpass -p is insecure; prefer keys."),
    # --- talk about passwords and secrets -----------------------------------------------------------
    ("rotate", "we should rotate the database password after the incident"),
    ("incorrect", "The password is incorrect, try again."),
    ("too short", "the password is too short"),
    ("stored hashed", "The password is stored hashed with argon2."),
    ("case sensitive", "the password is case-sensitive"),
    ("token expired", "the token is expired, refresh it"),
    ("secret is", "the secret is to keep the tests small"),
    ("api key in vault", "The API key is in the vault under payments/stripe."),
    ("token limit", "the prompt used 12000 tokens, close to the limit"),
    ("passwordless", "we moved to passwordless login last week"),
    ("secret santa", "secret santa signups close friday"),
    ("keys plural", "the keys of the dict are sorted"),
    ("key rotation doc", "Key rotation happens every 90 days; the new key id is logged."),
    # --- ordinary engineering text ------------------------------------------------------------------
    ("git sha", "fixed in commit 4f1c2a9b8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"),
    ("sha256 env", f"IMAGE_SHA256={fake(HEX, 64)}"),
    ("checksum", f"sha256sum: {fake(HEX, 64)}  switchboard.tar.gz"),
    ("uuid", "session 2f1e0d9c-8b7a-4c6d-9e8f-0a1b2c3d4e5f is idle"),
    ("integrity", f'"integrity": "sha512-{fake(B64, 86)}=="'),
    ("commit env", f"GIT_COMMIT={fake(HEX, 40)}"),
    ("path env", "PYTHONPATH=/srv/app/src:/srv/app/vendor/lib/python3.12/site-packages"),
    ("base64 image", "the logo is inlined as data:image/png;base64,iVBORw0KGgo and renders fine"),
    ("rm -r", "rm -r build/ then rebuild"),
    ("git push", "git push origin main"),
    ("pip install", "pip install detect-secrets==1.5.0"),
    ("pytest", "ran pytest -x -q: 212 passed in 14.2s"),
    (
        "traceback",
        'File "/srv/app/auth.py", line 42, in login\n    user = authenticate(username=u, password=p)',
    ),
    ("django settings", "AUTH_PASSWORD_VALIDATORS = [...]\nLOGIN_URL = '/login/'"),
    ("jwt prose", "the header of a JWT starts eyJ when base64 encoded"),
    ("period sentence", "Done. Next: wire the holds page. Then docs."),
]
