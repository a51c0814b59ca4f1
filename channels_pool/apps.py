from django.apps import AppConfig


class ChannelsPoolConfig(AppConfig):
    name = "channels_pool"
    verbose_name = "Upstream channels"
