package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.pgfork.Migrators;
import io.pgfork.TestDatabase;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

class RegisteredTest {
    @RegisterExtension
    static final PgforkExtension DB = PgforkExtension.of(Migrators.sqlFiles(Path.of("../pgfork/src/test/resources/sql")))
            .readOnly();

    @Test
    void sqlFilesInCode(TestDatabase db, Connection c) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT count(*) FROM colours")) {
            rs.next();
            assertEquals(2, rs.getInt(1), db.toString());
        }
    }
}
