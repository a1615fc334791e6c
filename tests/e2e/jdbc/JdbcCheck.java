// pgjdbc through dpproxy: a DP query, a GROUP BY (server-prepared, binary), a catalog query
// and a refusal. Prints key=value lines for tests/e2e/test_jdbc.py.
import java.sql.*;
import java.util.Properties;

public class JdbcCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", "analyst");
        props.setProperty("password", "analyst");
        props.setProperty("prepareThreshold", "1");  // named server-side statements from the first run
        props.setProperty("binaryTransfer", "true");
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM adult WITH ACCURACY 100")) {
                rs.next();
                System.out.println("count=" + rs.getDouble(1));
                SQLWarning w = st.getWarnings();
                System.out.println("notice=" + (w == null ? "" : w.getMessage()));
            }
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex WITH ACCURACY 200")) {
                for (int run = 0; run < 3; run++) {
                    try (ResultSet rs = ps.executeQuery()) {
                        StringBuilder sb = new StringBuilder();
                        while (rs.next()) sb.append(rs.getString("sex")).append(":").append(rs.getDouble("n") > 0).append(";");
                        System.out.println("group" + run + "=" + sb);
                    }
                }
            }
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT COUNT(*) FROM adult WHERE age >= ? AND sex = ? WITH ACCURACY 100")) {
                ps.setInt(1, 25);
                ps.setString(2, "Female");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    System.out.println("param=" + (rs.getDouble(1) > 0));
                }
            }
            try (ResultSet rs = conn.getMetaData().getTables(null, "public", "adult", null)) {
                rs.next();
                System.out.println("table=" + rs.getString("TABLE_NAME"));
            }
            try (ResultSet rs = conn.getMetaData().getColumns(null, "public", "adult", "age")) {
                rs.next();
                System.out.println("column=" + rs.getString("TYPE_NAME"));
            }
            for (String sql : new String[] {"SELECT * FROM adult", "SELECT COUNT(*) FROM adult WITH ACCURACY 0.0001",
                                            "SELECT COUNT(*) FROM adult WHERE age > 30 WITH ACCURACY 100"}) {
                try (Statement st = conn.createStatement()) {
                    st.executeQuery(sql);
                    System.out.println("refused=none");
                } catch (SQLException e) {
                    System.out.println("refused=" + e.getSQLState());
                }
            }
            conn.setAutoCommit(false);
            try (Statement st = conn.createStatement()) {
                st.execute("CREATE TEMP TABLE j (x int)");
                st.execute("INSERT INTO j VALUES (1)");
                try (ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM adult WITH ACCURACY 100")) { rs.next(); }
                conn.commit();
                try (ResultSet rs = st.executeQuery("SELECT count(*) FROM j")) {
                    rs.next();
                    System.out.println("committed=" + rs.getInt(1));
                }
            }
        }
    }
}
