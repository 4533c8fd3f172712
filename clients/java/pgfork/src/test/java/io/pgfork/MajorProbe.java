package io.pgfork;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.UUID;

/**
 * A test JVM of AutoStartIT's: gets this JVM's pgfork (Pgfork.get(), or Pgfork.get(args[0]) as the Spring
 * integration calls it with its property pgfork.pg), prints "VERSION ", the server_version of its PostgreSQL, " DB " and
 * the template database's name, and
 * with "hold" as args[1] keeps the run going (its lease) until its stdin ends. "ERROR " and the message when it fails.
 */
public final class MajorProbe {
    private MajorProbe() {
    }

    public static void main(String[] args) throws Exception {
        try {
            Pgfork pg = args.length > 0 && !args[0].equals("-") ? Pgfork.get(args[0]) : Pgfork.get();
            String hash = "javamajor" + UUID.randomUUID().toString().replace("-", "");
            TemplateDatabase tpl = pg.client().initializeTemplate(hash);
            DatabaseConfig c = tpl.config();
            try (Connection conn = DriverManager.getConnection(c.jdbcUrl(), c.username(), c.password());
                 Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT current_setting('server_version'), current_database()")) {
                rs.next();
                System.out.println("VERSION " + rs.getString(1) + " DB " + rs.getString(2));
            } finally {
                pg.client().discardTemplate(hash);
            }
        } catch (RuntimeException e) {
            System.out.println("ERROR " + e.getMessage());
            System.exit(1);
        }
        System.out.flush();
        if (args.length > 1 && args[1].equals("hold")) {
            System.in.readAllBytes();
        }
        System.exit(0);
    }
}
