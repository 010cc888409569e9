from django.apps import AppConfig


class MessagingConfig(AppConfig):
    name = "messaging"
    verbose_name = "Messaging"

    def ready(self) -> None:
        from messaging.services import operators

        operators.connect()  # every change to who is an operator is audited, whoever makes it
