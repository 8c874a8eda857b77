//! The one way the store speaks SQL, whichever database is behind it.
//!
//! Statements are written once, with PostgreSQL's `$1, $2, …` placeholders (SQLite is given
//! `?1, ?2, …`, which it binds by number the same way). Values cross as [`Value`]; rows come
//! back as [`Row`]s of values, read by column index with checked conversions. Where the two
//! dialects differ (a table's insertion order), [`Sql::kind`] says which one is speaking.

use super::StoreError;

/// Which database a connection speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
}

impl Kind {
    /// The column that orders a table's rows by insertion (`rowid` in SQLite, a sequence
    /// column in PostgreSQL).
    pub(crate) fn seq(self) -> &'static str {
        match self {
            Kind::Sqlite => "rowid",
            Kind::Postgres => "seq",
        }
    }

    /// An expression for the database's clock, in ms since the Unix epoch.
    pub(crate) fn now_ms(self) -> &'static str {
        match self {
            Kind::Sqlite => "CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)",
            Kind::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }
}

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    Bool(bool),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<u16> for Value {
    fn from(v: u16) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Blob(v.to_vec())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl From<&Vec<u8>> for Value {
    fn from(v: &Vec<u8>) -> Self {
        Value::Blob(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// The arguments of one statement: `args![a, b, c]`.
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::sql::Value::from($v)),*][..]
    };
}
pub(crate) use args;

/// One result row.
#[derive(Debug)]
pub(crate) struct Row(Vec<Value>);

impl Row {
    fn get(&self, i: usize) -> Result<&Value, StoreError> {
        self.0
            .get(i)
            .ok_or_else(|| StoreError::Database(format!("a row has no column {i}")))
    }

    fn wrong(i: usize, want: &str, got: &Value) -> StoreError {
        StoreError::Database(format!("column {i} holds {got:?}, not {want}"))
    }

    pub(crate) fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.opt_int(i)?
            .ok_or_else(|| Self::wrong(i, "an integer", &Value::Null))
    }

    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            v => Err(Self::wrong(i, "an integer", v)),
        }
    }

    pub(crate) fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        match self.get(i)? {
            Value::Bool(v) => Ok(*v),
            Value::Int(v) => Ok(*v != 0),
            v => Err(Self::wrong(i, "a boolean", v)),
        }
    }

    pub(crate) fn text(&self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?
            .ok_or_else(|| Self::wrong(i, "text", &Value::Null))
    }

    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.get(i)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            v => Err(Self::wrong(i, "text", v)),
        }
    }

    pub(crate) fn blob(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        match self.get(i)? {
            Value::Blob(v) => Ok(v.clone()),
            v => Err(Self::wrong(i, "bytes", v)),
        }
    }
}

/// A connection or an open transaction.
pub(crate) trait Sql {
    /// Which database this is.
    fn kind(&self) -> Kind;
    /// Runs one statement; returns how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, StoreError>;
    /// Runs one query; returns every row.
    fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError>;
}

impl dyn Sql + '_ {
    /// The first row of a query, if any.
    pub(crate) fn one(&mut self, sql: &str, args: &[Value]) -> Result<Option<Row>, StoreError> {
        Ok(self.query(sql, args)?.into_iter().next())
    }
}

/// `$1` → `?1` outside quoted strings, for SQLite.
pub(crate) fn sqlite_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push('?');
                continue;
            }
            None => {}
        }
        out.push(c);
    }
    out
}

// ---- SQLite ----

/// A SQLite connection or transaction.
pub(crate) struct Sqlite<'a>(pub(crate) &'a rusqlite::Connection);

fn to_sqlite(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Int(i) => V::Integer(*i),
        Value::Text(s) => V::Text(s.clone()),
        Value::Blob(b) => V::Blob(b.clone()),
        Value::Bool(b) => V::Integer(i64::from(*b)),
    }
}

impl Sql for Sqlite<'_> {
    fn kind(&self) -> Kind {
        Kind::Sqlite
    }

    fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, StoreError> {
        let mut stmt = self.0.prepare_cached(&sqlite_placeholders(sql))?;
        let n = stmt.execute(rusqlite::params_from_iter(args.iter().map(to_sqlite)))?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        use rusqlite::types::ValueRef;
        let mut stmt = self.0.prepare_cached(&sqlite_placeholders(sql))?;
        let width = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(args.iter().map(to_sqlite)))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(width);
            for i in 0..width {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(v) => Value::Int(v),
                    ValueRef::Real(v) => {
                        return Err(StoreError::Database(format!(
                            "column {i} holds the real number {v}"
                        )))
                    }
                    ValueRef::Text(t) => Value::Text(
                        std::str::from_utf8(t)
                            .map_err(|e| StoreError::Database(format!("column {i}: {e}")))?
                            .to_owned(),
                    ),
                    ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }
}

// ---- PostgreSQL ----

/// A PostgreSQL client or transaction.
pub(crate) struct Postgres<'a, C: postgres::GenericClient>(pub(crate) &'a mut C);

impl postgres::types::ToSql for Value {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::{IsNull, Type};
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) => match *ty {
                Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
                Type::BOOL => (*v != 0).to_sql(ty, out),
                _ => v.to_sql(ty, out),
            },
            Value::Text(s) => s.to_sql(ty, out),
            Value::Blob(b) => b.to_sql(ty, out),
            Value::Bool(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

fn pg_params(args: &[Value]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|v| v as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

fn from_pg(row: &postgres::Row, i: usize) -> Result<Value, StoreError> {
    use postgres::types::Type;
    let ty = row.columns()[i].type_().clone();
    let v = match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(i)?.map(Value::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)?
            .map(|v| Value::Int(i64::from(v))),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)?
            .map(|v| Value::Int(i64::from(v))),
        Type::BOOL => row.try_get::<_, Option<bool>>(i)?.map(Value::Bool),
        Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR => {
            row.try_get::<_, Option<String>>(i)?.map(Value::Text)
        }
        Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
        other => {
            return Err(StoreError::Database(format!(
                "column {i} has the unexpected type {other}"
            )))
        }
    };
    Ok(v.unwrap_or(Value::Null))
}

impl<C: postgres::GenericClient> Sql for Postgres<'_, C> {
    fn kind(&self) -> Kind {
        Kind::Postgres
    }

    fn execute(&mut self, sql: &str, args: &[Value]) -> Result<u64, StoreError> {
        Ok(self.0.execute(sql, &pg_params(args))?)
    }

    fn query(&mut self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        let rows = self.0.query(sql, &pg_params(args))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut row = Vec::with_capacity(r.len());
            for i in 0..r.len() {
                row.push(from_pg(r, i)?);
            }
            out.push(Row(row));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_sqlite_numbers_outside_strings() {
        assert_eq!(
            sqlite_placeholders("SELECT '$1', \"$2\" FROM t WHERE a = $1 AND b = $12"),
            "SELECT '$1', \"$2\" FROM t WHERE a = ?1 AND b = ?12"
        );
        assert_eq!(sqlite_placeholders("price $ 5"), "price $ 5");
    }
}
