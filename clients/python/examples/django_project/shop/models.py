from django.db import models


class Color(models.Model):
    name = models.CharField(max_length=40, unique=True)


class Widget(models.Model):
    name = models.CharField(max_length=80)
    color = models.ForeignKey(Color, null=True, on_delete=models.SET_NULL)
