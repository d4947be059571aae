from core.roles import roles_of


def roles(request):
    user_roles = roles_of(request.user)
    return {
        "roles": {
            name: (name in user_roles) for name in ("compliance", "oncall", "auditor", "viewer")
        }
    }
