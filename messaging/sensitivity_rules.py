"""The sensitive tier's rule table: what a leaked secret, a destructive command or a transcript
request looks like when an agent writes it. Read by `messaging.sensitivity`, which runs it.

Token shapes follow the public secret-scanning rule sets (gitleaks' default rules, detect-secrets'
plugins, GitHub's secret-scanning partner patterns); the assignment, command and prose rows follow
how agents paste secrets (shell `export`, `.env`, YAML, JSON, URLs, `curl -u`, `docker login -p`,
`mysql -p`, "my password is ..."). Every regex is bounded (no nested unbounded repeats), so a
1 MB text scans in linear time, and names in `needs` a substring every match holds, so a text
lacking it skips the regex. A `secret` group marks what is masked; without one the whole match is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CREDENTIAL, DESTRUCTIVE, TRANSCRIPT = "credential", "destructive", "transcript"
I = re.IGNORECASE  # noqa: E741


@dataclass(frozen=True)
class Rule:
    name: str  # stable code, stored with the message
    label: str  # what the console shows: "AWS secret access key", "destructive command: rm -rf"
    category: str  # credential | destructive | transcript
    regex: re.Pattern[str]
    # Substrings every match holds (lowercase when the regex ignores case, looked for in
    # `lowered_for_needs(text)`): a text without one is ruled out by `in`, never by the regex.
    needs: tuple[str, ...]
    ignores_case: bool
    # The captured value must look like a secret, not a reference to one (`os.environ[...]`,
    # `$VAR`, `<your-token>`): see `messaging.sensitivity.value_is_secret`.
    checks_value: bool = False
    # A PEM block: mask from the header to its END line (or the end of the text).
    to_block_end: bool = False
    # The value must be this random (Shannon bits per character) to count.
    min_entropy: float = 0.0
    # How far before a needle a match may start: the regex is tried (`match`) only there, at each
    # place a needle occurs, so a long text costs a few substring searches, not a regex scan.
    # None: the needle may be anywhere in a match, the regex scans the whole text (rare needles).
    back: int | None = 0
    # Needles whose matches start before them, with what precedes them there (the `api_` of
    # `api_key`): (needle, how far back at most, compiled regex of that lead, anchored at its end).
    leads: tuple[tuple[str, int, re.Pattern[str]], ...] = ()
    # When set, where the needles are looked for, as a regex (in the case the rule compares):
    # each match is a needle followed by what the rule needs next (an `=` or `:` after a name),
    # found in one pass of the engine instead of a loop over every occurrence of the needle.
    locate: re.Pattern[str] | None = None


def _r(
    name: str,
    label: str,
    category: str,
    regex: str,
    flags: int = 0,
    *,
    needs: tuple[str, ...],
    checks_value: bool = False,
    to_block_end: bool = False,
    min_entropy: float = 0.0,
    back: int | None = 0,
    leads: tuple[tuple[str, int, str], ...] = (),
    locate: str = "",
) -> Rule:
    return Rule(
        name,
        label,
        category,
        re.compile(regex, flags),
        needs,
        bool(flags & re.IGNORECASE),
        checks_value,
        to_block_end,
        min_entropy,
        back,
        tuple((needle, most, re.compile(f"(?:{lead})$")) for needle, most, lead in leads),
        re.compile(locate) if locate else None,  # looked for in the lowered text when ignoring case
    )


# Names of settings and variables that hold a secret, as agents spell them in code, shell, .env,
# YAML and JSON: DB_PASSWORD, PGPASSWORD, db_pass, JWT_SECRET, client_secret, STRIPE_API_KEY,
# access_token, auth-token, AccountKey, credentials, "apiKey". `pass` counts only as a word of the
# name (DB_PASS, pass), never inside one (bypass, passenger).
_SECRET_NAME = (
    r"(?:(?:password|passwd|passphrase|pwd|secret)s?"
    r"|(?<![a-z0-9])pass"
    r"|(?:api|access|secret|private|signing|encryption|master|account|auth|client|app|license|session)[_.-]?key"
    r"|token|credentials?|creds)"
    r"(?:[_.-][a-z0-9]{1,12}){0,2}"
)
# A value after `=`, `:`, `:=` or `=>`, quoted or bare.
_VALUE = r"""(?:"(?P<dq>[^"\n]{1,300})"|'(?P<sq>[^'\n]{1,300})'|`(?P<bq>[^`\n]{1,300})`|(?P<bare>[^\s"'`,;]{1,300}))"""

RULES: tuple[Rule, ...] = (
    # --- keys and tokens with a shape of their own ------------------------------------------------
    _r(
        "private_key_block",
        "private key block",
        CREDENTIAL,
        r"-----BEGIN (?:[A-Z0-9]{1,20} ){0,3}PRIVATE KEY(?: BLOCK)?-----",
        needs=("PRIVATE KEY",),
        back=None,
        to_block_end=True,
    ),
    _r(
        "aws_access_key",
        "AWS access key id",
        CREDENTIAL,
        r"\b(?P<secret>(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16})\b",
        needs=("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
    ),
    _r(
        "aws_secret_key",
        "AWS secret access key",
        CREDENTIAL,
        r"aws[a-z0-9_.-]{0,20}secret[a-z0-9_.-]{0,20}[\"']?\s{0,3}(?::|=|:=|=>)\s{0,3}[\"']?"
        r"(?P<secret>[a-z0-9/+=]{40})(?![a-z0-9/+=])",
        I,
        needs=("secret",),
        leads=(("secret", 24, r"aws[a-z0-9_.-]{0,20}"),),
        locate=r"secret(?=[a-z0-9_.-]{0,20}[\"']?\s{0,3}[=:])",
    ),
    _r(
        "github_token",
        "GitHub token",
        CREDENTIAL,
        r"\b(?P<secret>gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
        needs=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _r(
        "gitlab_token",
        "GitLab token",
        CREDENTIAL,
        r"\b(?P<secret>(?:glpat|gldt|glft|glsoat|glrt|glcbt|glimt|glptt|glagent|gloas)-[A-Za-z0-9_-]{20,1024}"
        r")",
        needs=(
            "glpat-",
            "gldt-",
            "glft-",
            "glsoat-",
            "glrt-",
            "glcbt-",
            "glimt-",
            "glptt-",
            "glagent-",
            "gloas-",
        ),
    ),
    _r(
        "gitlab_runner_token",
        "GitLab runner registration token",
        CREDENTIAL,
        r"\b(?P<secret>GR1348941[A-Za-z0-9_-]{20,50})",
        needs=("GR1348941",),
    ),
    _r(
        "llm_api_key",
        "OpenAI / Anthropic API key",
        CREDENTIAL,
        r"\b(?P<secret>sk-(?:ant-(?:api|admin)[0-9][0-9]-|proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,200})",
        needs=("sk-",),
    ),
    _r(
        "slack_token",
        "Slack token",
        CREDENTIAL,
        r"\b(?P<secret>xox[abposr]-[A-Za-z0-9-]{10,200}|xapp-[0-9]-[A-Za-z0-9-]{10,200})",
        needs=("xox", "xapp-"),
    ),
    _r(
        "slack_webhook",
        "Slack webhook URL",
        CREDENTIAL,
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/+-]{20,200})",
        needs=("hooks.slack.com/",),
    ),
    _r(
        "discord_webhook",
        "Discord webhook URL",
        CREDENTIAL,
        r"discord(?:app)?\.com/api/webhooks/[0-9]{5,30}/(?P<secret>[A-Za-z0-9_-]{40,100})",
        needs=("/api/webhooks/",),
        back=15,
    ),
    _r(
        "npm_token",
        "npm token",
        CREDENTIAL,
        r"\b(?P<secret>npm_[A-Za-z0-9]{36})\b",
        needs=("npm_",),
    ),
    _r(
        "huggingface_token",
        "Hugging Face token",
        CREDENTIAL,
        r"\b(?P<secret>(?:hf|api_org)_[A-Za-z0-9]{30,40})\b",
        needs=("hf_", "api_org_"),
    ),
    _r(
        "azure_storage_key",
        "Azure storage account key",
        CREDENTIAL,
        r"(?:AccountKey|SharedAccessKey)\s{0,3}=\s{0,3}(?P<secret>[A-Za-z0-9+/]{20,100}={0,2})",
        I,
        needs=("accountkey", "sharedaccesskey"),
    ),
    _r(
        "azure_sas_signature",
        "Azure SAS signature",
        CREDENTIAL,
        r"[?&]sig=(?P<secret>[A-Za-z0-9%+/]{30,120}={0,2})",
        needs=("sig=",),
        back=1,
    ),
    _r(
        "google_api_key",
        "Google API key",
        CREDENTIAL,
        r"\b(?P<secret>AIza[0-9A-Za-z_-]{35})\b",
        needs=("AIza",),
    ),
    _r(
        "google_oauth_secret",
        "Google OAuth client secret",
        CREDENTIAL,
        r"\b(?P<secret>GOCSPX-[A-Za-z0-9_-]{28})",
        needs=("GOCSPX-",),
    ),
    _r(
        "stripe_key",
        "Stripe secret key",
        CREDENTIAL,
        r"\b(?P<secret>[rs]k_(?:live|test|prod)_[0-9A-Za-z]{16,200})",
        needs=("k_live_", "k_test_", "k_prod_"),
        back=1,
    ),
    _r(
        "twilio_key",
        "Twilio API key",
        CREDENTIAL,
        r"\b(?P<secret>SK[0-9a-f]{32})\b",
        needs=("SK",),
    ),
    _r(
        "sendgrid_key",
        "SendGrid API key",
        CREDENTIAL,
        r"\b(?P<secret>SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43})",
        needs=("SG.",),
    ),
    _r("mailgun_key", "Mailgun API key", CREDENTIAL, r"\b(?P<secret>key-[0-9a-z]{32})\b", needs=("key-",)),
    _r(
        "mailchimp_key",
        "Mailchimp API key",
        CREDENTIAL,
        r"\b(?P<secret>[0-9a-f]{32}-us[0-9]{1,2})\b",
        needs=("-us",),
        back=32,
    ),
    _r(
        "square_token",
        "Square token",
        CREDENTIAL,
        r"\b(?P<secret>sq0(?:atp|csp)-[0-9A-Za-z_-]{22,43}|EAAA[0-9A-Za-z_-]{60})",
        needs=("sq0atp-", "sq0csp-", "EAAA"),
    ),
    _r(
        "shopify_token",
        "Shopify token",
        CREDENTIAL,
        r"\b(?P<secret>shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32})\b",
        needs=("shpat_", "shpss_", "shpca_", "shppa_"),
    ),
    _r(
        "pypi_token",
        "PyPI token",
        CREDENTIAL,
        r"\b(?P<secret>pypi-AgE[A-Za-z0-9_-]{50,300})",
        needs=("pypi-AgE",),
    ),
    _r(
        "digitalocean_token",
        "DigitalOcean token",
        CREDENTIAL,
        r"\b(?P<secret>do[opr]_v1_[a-f0-9]{64})\b",
        needs=("_v1_",),
        back=3,
    ),
    _r(
        "databricks_token",
        "Databricks token",
        CREDENTIAL,
        r"\b(?P<secret>dapi[a-f0-9]{32}(?:-[0-9])?)\b",
        needs=("dapi",),
    ),
    _r(
        "telegram_bot_token",
        "Telegram bot token",
        CREDENTIAL,
        r"\b(?P<secret>[0-9]{8,10}:AA[0-9A-Za-z_-]{33})(?![0-9A-Za-z_-])",
        needs=(":AA",),
        back=10,
    ),
    _r(
        "discord_bot_token",
        "Discord bot token",
        CREDENTIAL,
        # No prefix of its own: counted only after the word discord, as gitleaks does.
        r"discord[^\n]{0,40}?\b(?P<secret>[mno][a-z0-9_-]{23,25}\.[a-z0-9_-]{6}\.[a-z0-9_-]{27,38})\b",
        I,
        needs=("discord",),
        back=None,
    ),
    _r(
        "vault_token",
        "HashiCorp Vault token",
        CREDENTIAL,
        r"\b(?P<secret>hv[sb]\.[A-Za-z0-9_-]{24,200})",
        needs=("hvs.", "hvb."),
    ),
    _r(
        "postman_key",
        "Postman API key",
        CREDENTIAL,
        r"\b(?P<secret>PMAK-[a-f0-9]{24}-[a-f0-9]{34})\b",
        needs=("PMAK-",),
    ),
    _r(
        "age_secret_key",
        "age secret key",
        CREDENTIAL,
        r"\b(?P<secret>AGE-SECRET-KEY-1[0-9A-Z]{58})\b",
        needs=("AGE-SECRET-KEY-",),
    ),
    _r(
        "prefixed_service_token",
        "service API token",
        CREDENTIAL,
        # Linear, New Relic, Grafana, Sentry, Atlassian, Pulumi, Supabase, Doppler, Heroku, fly.io
        r"\b(?P<secret>lin_api_[A-Za-z0-9]{40}|NRAK-[A-Z0-9]{27}|gl(?:c|sa)_[A-Za-z0-9+/_]{32,400}"
        r"|sntry[su]_[A-Za-z0-9+/=_]{40,400}|ATATT3[A-Za-z0-9_=-]{150,300}|pul-[a-f0-9]{40}"
        r"|sbp_[a-f0-9]{40}|dp\.(?:pt|st|sa|ct)\.[A-Za-z0-9]{40,44}|HRKU-[A-Za-z0-9_-]{30,80}"
        r"|fo1_[A-Za-z0-9_-]{40,50})",
        needs=(
            "lin_api_",
            "NRAK-",
            "glc_",
            "glsa_",
            "sntry",
            "ATATT3",
            "pul-",
            "sbp_",
            "dp.",
            "HRKU-",
            "fo1_",
        ),
    ),
    _r(
        "switchboard_token",
        "Switchboard session or operator token",
        CREDENTIAL,
        r"\b(?P<secret>sb[so]_[A-Za-z0-9_-]{40,60})",
        needs=("sbs_", "sbo_"),
    ),
    _r(
        "jwt",
        "JSON Web Token",
        CREDENTIAL,
        r"\b(?P<secret>eyJ[A-Za-z0-9_-]{8,2000}\.eyJ[A-Za-z0-9_-]{8,4000}\.[A-Za-z0-9_-]{8,2000})",
        needs=("eyJ",),
    ),
    # --- secrets by where they stand --------------------------------------------------------------
    _r(
        "auth_header",
        "Authorization header",
        CREDENTIAL,
        r"\b(?:authorization|proxy-authorization)[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
        r"(?:(?:bearer|token|basic|bot|apikey|key|digest)\s{1,5})?(?P<secret>[A-Za-z0-9._~+/=-]{12,2000})"
        r"|\bx-(?:api-key|auth-token|access-token|apikey|api-token)[\"']?\s{0,3}:\s{0,3}[\"']?"
        r"(?P<secret2>[A-Za-z0-9._~+/=-]{12,500})",
        I,
        needs=("authorization", "x-a"),
        back=6,
        checks_value=True,
    ),
    _r(
        "url_with_password",
        "password in a URL",
        CREDENTIAL,
        r"\b[a-z][a-z0-9+.-]{1,20}://[^\s/:@\"'<>]{0,100}:(?P<secret>[^\s/@\"'<>]{1,200})@[a-z0-9\[]",
        I,
        needs=("://",),
        back=21,
        checks_value=True,
    ),
    _r(
        "command_password",
        "password on a command line",
        CREDENTIAL,
        # curl -u user:pass, docker login -p pass, mysql -ppass, sshpass -p pass, redis-cli -a pass,
        # htpasswd -b file user pass is left out (its password is the last word, with no flag).
        r"\bcurl\b[^\n|;&]{0,300}?\s(?:-u|--user)(?:\s{1,5}|=)[\"']?[^\s:\"']{0,100}:(?P<secret>[^\s\"']{1,200})"
        r"|\b(?:docker|podman|helm\s{1,5}registry|nerdctl)\s{1,5}login\b[^\n|;&]{0,300}?\s(?:-p|--password)(?:\s{1,5}|=)[\"']?(?P<secret2>[^\s\"']{3,200})"
        r"|\bmysql(?:dump|admin|sh)?\b[^\n|;&]{0,300}?\s(?:-p|--password=)[\"']?(?P<secret3>[^\s\"'-][^\s\"']{2,200})"
        r"|\bsshpass\s{1,5}-p\s{0,5}[\"']?(?P<secret4>[^\s\"']{3,200})"
        r"|\bredis-cli\b[^\n|;&]{0,300}?\s(?:-a|--pass)\s{1,5}[\"']?(?P<secret5>[^\s\"']{3,200})",
        needs=("curl", "login", "mysql", "sshpass", "redis-cli"),
        leads=(("login", 24, r"(?:docker|podman|helm\s{1,5}registry|nerdctl)\s{1,5}"),),
        checks_value=True,
    ),
    _r(
        "secret_assignment",
        "password or secret in an assignment",
        CREDENTIAL,
        # KEY=value (shell, .env, export), key: value (YAML), "key": "value" (JSON), key := value.
        rf"(?P<name>{_SECRET_NAME})[\"']?\s{{0,3}}(?P<op>:=|=>|=(?!=)|:(?!:))\s{{0,3}}{_VALUE}",
        I,
        needs=("pass", "pwd", "secret", "key", "token", "cred"),
        leads=(
            (
                "key",
                11,
                r"(?:api|access|secret|private|signing|encryption|master|account|auth|client|app|license|session)[_.-]?",
            ),
        ),
        locate=r"(?:pass|pwd|secret|key|token|cred)(?=[a-z0-9_.-]{0,40}[\"']?\s{0,3}[=:])",
        checks_value=True,
    ),
    _r(
        "high_entropy_assignment",
        "high-entropy value in an assignment",
        CREDENTIAL,
        # An environment-style NAME=value whose value is long and random (a key under any name);
        # matched from the `=`, the NAME before it is checked by `messaging.sensitivity`.
        r"=\s{0,3}[\"']?(?P<secret>[A-Za-z0-9+/_=.-]{24,300})",
        needs=("=",),
        back=None,
        checks_value=True,
        min_entropy=4.3,
    ),
    _r(
        "password_in_prose",
        "password in a sentence",
        CREDENTIAL,
        r"\b(?:password|passphrase|passcode|passwd|pin|pw|token|api key|secret)(?:\s{1,3}(?:is|was)|\s{0,3}:|\s{1,3}for\s{1,3}\S{1,60}\s{1,3}is)"
        r"\s{0,3}[\"'`]?(?P<secret>[^\s\"'`]{6,200})",
        I,
        needs=("pass", "pin", "pw", "token", "api key", "secret"),
        locate=r"(?:pass|pin|pw|token|api key|secret)(?=[a-z]{0,6}(?:\s{0,3}:|\s{1,3}(?:is|was|for)))",
        checks_value=True,
    ),
    # --- destructive commands ---------------------------------------------------------------------
    _r(
        "rm_recursive_force",
        "destructive command: rm -rf",
        DESTRUCTIVE,
        r"\brm\s{1,5}(?:-[A-Za-z]{0,5}(?:r[A-Za-z]{0,5}f|f[A-Za-z]{0,5}r)[A-Za-z]{0,5}\b|(?:-[rRf]\s{1,5}-[rRf]\b)"
        r"|--recursive\s{1,5}--force\b|--force\s{1,5}--recursive\b)",
        I,
        needs=("rm",),
    ),
    _r(
        "git_force_push",
        "destructive command: git push --force",
        DESTRUCTIVE,
        r"\bgit\s{1,5}push\b[^\n;&|]{0,200}?(?:\s--force(?:-with-lease)?\b|\s-f\b|\s\+[\w./-]{1,200})",
        needs=("push",),
        leads=(("push", 8, r"git\s{1,5}"),),
    ),
    _r(
        "git_reset_hard",
        "destructive command: git reset --hard",
        DESTRUCTIVE,
        r"\bgit\s{1,5}reset\s{1,5}--hard\b",
        needs=("--hard",),
        back=18,
    ),
    _r(
        "sql_drop",
        "destructive command: DROP TABLE / DATABASE",
        DESTRUCTIVE,
        r"\bdrop\s{1,5}(?:table|database|schema)\b",
        I,
        needs=("drop",),
    ),
    _r(
        "sql_truncate",
        "destructive command: TRUNCATE TABLE",
        DESTRUCTIVE,
        r"\btruncate\s{1,5}table\b",
        I,
        needs=("truncate",),
    ),
    _r(
        "mkfs",
        "destructive command: mkfs",
        DESTRUCTIVE,
        r"\bmkfs(?:\.[a-z0-9]{1,10})?\s",
        I,
        needs=("mkfs",),
    ),
    _r(
        "dd_to_device",
        "destructive command: dd to a device",
        DESTRUCTIVE,
        r"\bdd\s[^\n]{0,200}?\bof=/dev/",
        needs=("of=/dev/",),
        back=None,
    ),
    _r(
        "redirect_to_disk",
        "destructive command: writing over a disk",
        DESTRUCTIVE,
        r">\s{0,3}/dev/(?:sd[a-z]|nvme[0-9]|hd[a-z]|vd[a-z]|disk[0-9])",
        needs=("/dev/",),
        back=4,
    ),
    _r(
        "fork_bomb",
        "destructive command: fork bomb",
        DESTRUCTIVE,
        r":\(\)\s{0,3}\{\s{0,3}:\s{0,3}\|\s{0,3}:\s{0,3}&\s{0,3}\}\s{0,3};\s{0,3}:",
        needs=(":()",),
    ),
    # --- transcript requests ----------------------------------------------------------------------
    _r(
        "transcript_request",
        "request for a session's transcript",
        TRANSCRIPT,
        r"\b(?:send|share|paste|give|show|dump|forward|export|print|copy|reveal|tell)\b[^.\n?!]{0,40}?"
        r"\b(?:your|its|their|his|her|the other session'?s?|another session'?s?)\s{1,3}(?:full\s|entire\s|whole\s)?"
        r"(?:transcript|conversation history|chat history|session log|conversation log|system prompt|context window)",
        I,
        needs=(
            "transcript",
            "conversation history",
            "chat history",
            "session log",
            "conversation log",
            "system prompt",
            "context window",
        ),
        back=None,
    ),
)

# Rules whose every match lies within a run of TOKEN_RUN characters (a token written out whole):
# their needles are looked for only in a text's runs, which prose barely has.
TOKEN_RUN = re.compile(r"[A-Za-z0-9_.+/=:%-]{14,}")
IN_TOKEN_RUNS = frozenset(
    [
        "aws_access_key",
        "github_token",
        "gitlab_token",
        "gitlab_runner_token",
        "llm_api_key",
        "slack_token",
        "slack_webhook",
        "discord_webhook",
        "npm_token",
        "huggingface_token",
        "azure_sas_signature",
        "google_api_key",
        "google_oauth_secret",
        "stripe_key",
        "twilio_key",
        "sendgrid_key",
        "mailgun_key",
        "mailchimp_key",
        "square_token",
        "shopify_token",
        "pypi_token",
        "digitalocean_token",
        "databricks_token",
        "telegram_bot_token",
        "vault_token",
        "postman_key",
        "age_secret_key",
        "prefixed_service_token",
        "switchboard_token",
        "jwt",
    ]
)
