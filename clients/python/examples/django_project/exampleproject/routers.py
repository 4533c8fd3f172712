class AuditRouter:
    """The audit app in the "other" database, everything else in "default"."""

    def db_for_read(self, model, **hints):
        return "other" if model._meta.app_label == "audit" else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, **hints):
        if app_label == "audit":
            return db == "other"
        return db == "default"
