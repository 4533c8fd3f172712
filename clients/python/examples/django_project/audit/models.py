from django.db import models


class Entry(models.Model):
    message = models.TextField()
