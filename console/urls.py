from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("login/", views.login, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("", views.overview, name="overview"),
    path("logs/", views.logs, name="logs"),
    path("logs/<str:request_id>/", views.log_detail, name="log"),
    path("statement/", views.statement, name="statement"),
    path("statement.csv", views.statement_csv, name="statement_csv"),
    path("keys/", views.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/<int:key_id>/rotate/", views.key_rotate, name="key_rotate"),
    path("connect/", views.connect, name="connect"),
    path("people/", views.people, name="people"),
    path("people/invitations/<int:invitation_id>/cancel/", views.invitation_cancel, name="invitation_cancel"),
    path("people/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path("invite/<str:token>/", views.invite_accept, name="invite"),
    path("password/forgot/", views.password_forgot, name="password_forgot"),
    path("reset/<str:uidb64>/<str:token>/", views.password_reset, name="password_reset"),
]
