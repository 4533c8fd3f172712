-- Spring's SQL init scripts (spring.sql.init), for an application without Flyway or Liquibase.
CREATE TABLE IF NOT EXISTS shelf (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL);
