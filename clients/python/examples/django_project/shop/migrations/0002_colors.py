from django.db import migrations


def add_colors(apps, schema_editor):
    Color = apps.get_model("shop", "Color")
    for name in ("red", "green", "blue"):
        Color.objects.using(schema_editor.connection.alias).create(name=name)


class Migration(migrations.Migration):
    """Data every test sees: rows a flush would delete."""

    dependencies = [("shop", "0001_initial")]
    operations = [migrations.RunPython(add_colors, migrations.RunPython.noop)]
