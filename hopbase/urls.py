from django.contrib import admin
from django.urls import include, path, re_path

from billing import dashboard
from gateway import views
from serving import views as process_views

GEMINI_VERSION = r"(?P<version>v1|v1beta|v1alpha)"

urlpatterns = [
    path("healthz", process_views.healthz),
    path("readyz", process_views.readyz),
    path("metrics", process_views.metrics_text),
    path("v1/chat/completions", views.chat_completions),
    path("v1/responses", views.responses),
    path("v1/messages", views.messages),
    path("v1/messages/count_tokens", views.messages_count_tokens),
    path("v1/embeddings", views.embeddings),
    path("v1/models", views.models),
    path("v1/usage", views.usage),
    re_path(
        rf"^{GEMINI_VERSION}/models/(?P<model>[^/:]+):(?P<action>generateContent|streamGenerateContent)$",
        views.gemini_generate,
    ),
    re_path(rf"^{GEMINI_VERSION}/models/(?P<model>[^/:]+):countTokens$", views.gemini_count_tokens),
    re_path(
        rf"^{GEMINI_VERSION}/models/(?P<model>[^/:]+):(?P<action>embedContent|batchEmbedContents)$", views.gemini_embed,
    ),
    re_path(rf"^{GEMINI_VERSION}/models$", views.gemini_models),
    re_path(rf"^{GEMINI_VERSION}/cachedContents$", views.gemini_cached_contents),
    re_path(r"^v1/models/(?P<model>[^/:]+)$", views.model),
    re_path(rf"^{GEMINI_VERSION}/models/(?P<model>[^/:]+)$", views.gemini_model),
    re_path(r"^(?P<version>v1beta|v1alpha)/(?P<rest>.*)$", views.unknown_gemini_path),
    re_path(r"^v1/(?P<rest>.*)$", views.unknown_openai_path),
    path("admin/dashboard/", dashboard.view, name="billing_dashboard"),
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
]
