package io.pgfork.example;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.flywaydb.core.api.callback.BaseCallback;
import org.flywaydb.core.api.callback.Context;
import org.flywaydb.core.api.callback.Event;

/** A Flyway callback bean (Spring Boot gives it to the application's Flyway): the events that Flyway ran. */
class FlywayEvents extends BaseCallback {
    final List<Event> seen = new CopyOnWriteArrayList<>();

    @Override
    public void handle(Event event, Context context) {
        seen.add(event);
    }
}
