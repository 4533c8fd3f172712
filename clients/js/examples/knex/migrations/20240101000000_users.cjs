exports.up = (knex) =>
  knex.schema.createTable("users", (t) => {
    t.increments("id");
    t.text("name").notNullable().unique();
  });

exports.down = (knex) => knex.schema.dropTable("users");
