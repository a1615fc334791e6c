// Replays a tool's SQL through pgjdbc, as JDBC-based tools (Metabase, DBeaver, Tableau's JDBC
// connector) send it. Reads steps from stdin, one per line, tab-separated, a newline in SQL as \n:
//   query <sql> [param...]   a PreparedStatement (extended protocol); a param is long:N, int:N,
//                            str:S, or first:K (the first value step K returned, as a long)
//   exec <sql>               a plain Statement (pgjdbc's extended protocol, unnamed; each
//                            statement of a query string its own result)
//   fetch <n> <sql>          a PreparedStatement with setFetchSize(n): pgjdbc then reads a
//                            portal n rows at a time (Execute with a row limit), out of autocommit
//   autocommit on|off, commit
// Prints "<step>\t<column>=<value>\t..." per row and "<step>\t!<SQLSTATE>" per error, for
// tests/e2e/test_jdbc_tools.py.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.*;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

public class SqlReplay {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args.length > 1 ? args[1] : "analyst");
        props.setProperty("password", args.length > 2 ? args[2] : "analyst");
        props.setProperty("prepareThreshold", "1");  // named server-side statements, as tools get after a few runs
        List<String> firsts = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            String line;
            int step = 0;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) continue;
                String[] part = line.split("\t");
                for (int i = 0; i < part.length; i++) part[i] = part[i].replace("\\n", "\n");
                String first = null;
                try {
                    switch (part[0]) {
                        case "autocommit": conn.setAutoCommit(part[1].equals("on")); break;
                        case "commit": conn.commit(); break;
                        case "exec":
                            try (Statement st = conn.createStatement()) {
                                // a query string of several statements gives several results
                                boolean rows = st.execute(part[1]);
                                while (rows || st.getUpdateCount() != -1) {
                                    if (rows) {
                                        String got = print(step, st.getResultSet());
                                        if (first == null) first = got;
                                    }
                                    rows = st.getMoreResults();
                                }
                            }
                            break;
                        case "query":
                        case "fetch": {
                            boolean fetch = part[0].equals("fetch");
                            int sql = fetch ? 2 : 1;
                            try (PreparedStatement ps = conn.prepareStatement(part[sql])) {
                                if (fetch) ps.setFetchSize(Integer.parseInt(part[1]));
                                for (int i = sql + 1; i < part.length; i++) {
                                    String[] p = part[i].split(":", 2);
                                    int at = i - sql;
                                    switch (p[0]) {
                                        case "long": ps.setLong(at, Long.parseLong(p[1])); break;
                                        case "int": ps.setInt(at, Integer.parseInt(p[1])); break;
                                        case "first": ps.setLong(at, Long.parseLong(firsts.get(Integer.parseInt(p[1])))); break;
                                        default: ps.setString(at, p[1]);
                                    }
                                }
                                if (ps.execute()) first = print(step, ps.getResultSet());
                            }
                            break;
                        }
                        default: throw new IllegalArgumentException(part[0]);
                    }
                } catch (SQLException e) {
                    System.out.println(step + "\t!" + e.getSQLState());
                    if (!conn.getAutoCommit()) conn.rollback();
                }
                firsts.add(first);
                step++;
            }
        }
    }

    private static String print(int step, ResultSet rs) throws SQLException {
        ResultSetMetaData meta = rs.getMetaData();
        String first = null;
        while (rs.next()) {
            StringBuilder sb = new StringBuilder().append(step);
            for (int c = 1; c <= meta.getColumnCount(); c++) {
                String value = rs.getString(c);
                if (first == null && c == 1) first = value;
                sb.append('\t').append(meta.getColumnLabel(c)).append('=')
                  .append(value == null ? "\\N" : value.replace("\t", " ").replace("\n", " "));
            }
            System.out.println(sb);
        }
        return first;
    }
}
