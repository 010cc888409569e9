# One image for the production topology's web, worker and beat services (see compose.yaml).
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=hub.settings \
    SWITCHBOARD_HOME=/var/lib/switchboard

WORKDIR /app
COPY . .
RUN pip install --no-cache-dir '.[hub]' \
    && useradd --system --home-dir /var/lib/switchboard --create-home switchboard \
    && chmod 0700 /var/lib/switchboard
USER switchboard

EXPOSE 8000
# web by default; compose overrides the command for worker and beat.
CMD ["switchboard", "web", "-b", "0.0.0.0", "-p", "8000", "hub.asgi:application"]
