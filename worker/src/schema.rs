//! Schema migrations of a Durable Object's SQLite: numbered, each applied once and in order, the
//! number kept in the object's `schema_version` table under the schema's name (an object may hold
//! several: the session actor's store, its approvals, …); a failure is an error the object
//! answers with (500 `storage_failed`), never ignored.
//!
//! The first migrations of an object that existed before numbering are its old `CREATE TABLE IF
//! NOT EXISTS` statements and column additions that check the column first, so running them over
//! tables made before is harmless. The constructor of a Durable Object is synchronous, so its
//! migrations commit together (nothing awaits between them).

use serde::Deserialize;
use worker::SqlStorage;

/// One step of a schema.
pub(crate) enum Migration {
    /// A statement.
    Sql(&'static str),
    /// `ALTER TABLE table ADD COLUMN column definition`, unless the column is there already
    /// (added before migrations were numbered).
    AddColumn {
        table: &'static str,
        column: &'static str,
        definition: &'static str,
    },
}

#[derive(Deserialize)]
struct VersionRow {
    version: f64,
}

/// Applies the migrations of schema `name` past its stored version, in order. Returns the error
/// of the first that failed (the version stays at the last that succeeded).
pub(crate) fn migrate(
    sql: &SqlStorage,
    name: &str,
    migrations: &[Migration],
) -> Result<(), String> {
    let fail =
        |step: usize, e: worker::Error| format!("{name} schema migration {step} failed: {e}");
    sql.exec(
        "CREATE TABLE IF NOT EXISTS schema_version (name TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        None,
    )
    .map_err(|e| fail(0, e))?;
    let rows: Vec<VersionRow> = sql
        .exec(
            "SELECT version FROM schema_version WHERE name = ?",
            vec![name.into()],
        )
        .and_then(|cursor| cursor.to_array())
        .map_err(|e| fail(0, e))?;
    let applied = rows.first().map_or(0, |r| r.version as usize);
    if applied > migrations.len() {
        return Err(format!(
            "the {name} schema is at version {applied}, newer than this code's {}",
            migrations.len()
        ));
    }
    for (index, migration) in migrations.iter().enumerate().skip(applied) {
        let step = index + 1;
        match migration {
            Migration::Sql(statement) => {
                sql.exec(statement, None).map_err(|e| fail(step, e))?;
            }
            Migration::AddColumn {
                table,
                column,
                definition,
            } => {
                let columns = sql
                    .exec(&format!("SELECT * FROM {table} LIMIT 0"), None)
                    .map_err(|e| fail(step, e))?
                    .column_names();
                if !columns.iter().any(|c| c == column) {
                    sql.exec(
                        &format!("ALTER TABLE {table} ADD COLUMN {column} {definition}"),
                        None,
                    )
                    .map_err(|e| fail(step, e))?;
                }
            }
        }
        sql.exec(
            "INSERT INTO schema_version (name, version) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET version = excluded.version",
            vec![name.into(), (step as i64).into()],
        )
        .map_err(|e| fail(step, e))?;
    }
    Ok(())
}
